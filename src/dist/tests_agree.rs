use super::tests_tcp::{group, on_all};
use super::{check_same_config, Communicator, RendezvousOpts};
use std::time::Duration;

fn opts(fingerprint: &str, lr: f64) -> RendezvousOpts {
    RendezvousOpts {
        fingerprint: fingerprint.into(),
        config: serde_json::json!({ "optimizer": { "lr": lr, "name": "sgd" } }),
        job_token: None,
        timeout: Duration::from_secs(5),
    }
}

#[test]
fn ranks_with_the_same_fingerprint_pass() {
    let comms = group(3, 5000);
    let got = on_all(&comms, |c| check_same_config(c, &opts("abcde", 0.05)));
    assert!(got.iter().all(|r| r.is_ok()), "{got:?}");
}

#[test]
fn every_rank_names_the_first_rank_that_differs_and_the_keys() {
    let comms = group(3, 5000);
    // Rank 2's fingerprint is longer and odd-length: the exchange pads and cuts it back.
    let got = on_all(&comms, |c| {
        let o = if c.rank() == 2 { opts("fffffff", 0.1) } else { opts("abcd", 0.05) };
        check_same_config(c, &o).map_err(|e| e.to_string())
    });
    for (r, res) in got.iter().enumerate() {
        let msg = res.as_ref().err().unwrap_or_else(|| panic!("rank {r} passed"));
        assert!(
            msg.contains(
                "config differs: rank 0 has fingerprint abcd, rank 2 has fffffff; the keys that differ:"
            ),
            "{msg}"
        );
        assert!(msg.contains("optimizer.lr") && msg.contains("0.05") && msg.contains("0.1"), "{msg}");
        assert!(!msg.contains("optimizer.name"), "{msg}");
    }
}

#[test]
fn without_configs_to_compare_the_refusal_says_where_to_look() {
    let comms = group(2, 5000);
    let got = on_all(&comms, |c| {
        let mut o = opts(if c.rank() == 0 { "aa" } else { "bb" }, 0.05);
        o.config = serde_json::Value::Null;
        check_same_config(c, &o).map_err(|e| e.to_string())
    });
    for res in &got {
        let msg = res.as_ref().expect_err("refused");
        assert!(
            msg.contains("rank 0 has fingerprint aa, rank 1 has bb; compare `ddptrain check` on both"),
            "{msg}"
        );
    }
}
