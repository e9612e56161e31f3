//! stdout and stderr that a closed or broken pipe cannot stop: `ddptrain
//! ... | head -2`, a terminal that went away, a full disk behind a
//! redirection. A line that cannot be written is lost; the run goes on, and
//! its files (`train.log`, `metrics.jsonl`, checkpoints) still get
//! everything. `println!` would panic there instead, killing the training.

use std::io::Write;

/// `line` and a newline on stdout, or nothing if stdout is gone.
pub fn out(line: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}").and_then(|()| o.flush());
}

/// `text` on stdout as it is (no newline added), or nothing if stdout is gone.
pub fn out_raw(text: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(text.as_bytes()).and_then(|()| o.flush());
}

/// `line` and a newline on stderr, or nothing if stderr is gone.
pub fn err(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// `println!` that a closed stdout does not stop ([`out`]).
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => { $crate::metrics::console::out(&format!($($arg)*)) };
}

/// `eprintln!` that a closed stderr does not stop ([`err`]).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => { $crate::metrics::console::err(&format!($($arg)*)) };
}
