//! `ddptrain launch --help` documents every flag `launch` accepts, each with a
//! description, and shows torchrun's spellings of the flags torchrun has.

mod common;
use clap::Args;
use common::*;

/// torchrun's flags that `launch` takes under the same names.
const TORCHRUN_NAMES: &[&str] = &[
    "--nproc-per-node",
    "--nproc_per_node",
    "--nnodes",
    "--node-rank",
    "--node_rank",
    "--master-addr",
    "--master_addr",
    "--master-port",
    "--master_port",
    "--max-restarts",
    "--max_restarts",
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    "--rdzv-id",
    "--rdzv_id",
    "--rdzv-backend",
    "--rdzv_backend",
    "--monitor-interval",
    "--monitor_interval",
];

/// Whether `help` shows `flag` as a whole word (not as the start of a longer flag).
fn shows(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(at, _)| {
        let next = help[at + flag.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

fn help_text() -> String {
    let o = ddptrain(&["launch", "--help"], &repo_root());
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn launch_help_documents_every_accepted_flag() {
    let help = help_text();
    let cmd = ddptrain::launch::LaunchArgs::augment_args(clap::Command::new("launch"));
    let mut flags = 0;
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        let about = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        assert!(!about.trim().is_empty(), "`{id}` has no description");
        assert!(help.contains(about.trim()), "the description of `{id}` is not in the help:\n{help}");
        if let Some(long) = arg.get_long() {
            flags += 1;
            // Every spelling the parser accepts, hidden aliases included, must be shown.
            let names = std::iter::once(long).chain(arg.get_all_aliases().unwrap_or_default());
            for name in names {
                assert!(
                    help.contains(&format!("--{name}")),
                    "`--{name}` is accepted but not in the help:\n{help}"
                );
            }
        } else {
            let value = arg.get_value_names().and_then(|v| v.first().map(|n| n.to_string()));
            let value = value.unwrap_or_else(|| id.to_uppercase());
            assert!(help.contains(&format!("<{value}>")), "`{value}` is not in the help:\n{help}");
        }
    }
    assert!(flags >= 7, "launch's flags were not found: {flags}");
    assert!(shows(&help, "--standalone"), "torchrun's `--standalone` is not in the help:\n{help}");
    for name in TORCHRUN_NAMES {
        assert!(shows(&help, name), "torchrun's `{name}` is not in the help:\n{help}");
        let parsed = cmd.clone().try_get_matches_from(["launch", name, "1", "--", "x"]);
        assert!(parsed.is_ok(), "torchrun's `{name}` is not accepted: {parsed:?}");
    }
}
