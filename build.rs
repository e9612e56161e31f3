//! Embeds every `kernels/*.cu` and `*.cuh` file in the binary (src/cuda/kernels.rs
//! includes the table written here), so adding a kernel is adding its file.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("{}: {e}", dir.display())).file_name().to_string_lossy().into_owned()
        })
        .filter(|n| n.ends_with(".cu") || n.ends_with(".cuh"))
        .collect();
    files.sort();
    let mut out = String::new();
    for (name, ext) in [("SOURCES", ".cu"), ("HEADERS", ".cuh")] {
        writeln!(out, "pub const {name}: &[(&str, &str)] = &[").unwrap();
        for f in files.iter().filter(|f| f.ends_with(ext)) {
            // include_str! recompiles on an edit; the folder's line above reruns this on a new file.
            writeln!(out, "    ({f:?}, include_str!({:?})),", dir.join(f).display().to_string()).unwrap();
        }
        writeln!(out, "];").unwrap();
    }
    let dest = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("kernels.rs");
    std::fs::write(&dest, out).unwrap_or_else(|e| panic!("{}: {e}", dest.display()));
}
