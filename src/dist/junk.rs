//! Bounded logging of strangers on a listening port (rank 0's master port, a
//! rank's data-mesh port). A connection that is not a rank of this job
//! (garbage, a scanner, a wrong job token) is reported, but a flood of them
//! must not flood the log: the first few are reported in full, the rest are
//! counted and summed up in one line when the listening ends.

/// Strangers reported one by one before the rest are only counted.
pub(super) const SHOWN: usize = 3;

/// Where a listener reports strangers; at most `SHOWN + 2` lines.
pub(super) struct JunkLog {
    sink: Box<dyn FnMut(&str) + Send>,
    shown: usize,
    suppressed: u64,
}

impl JunkLog {
    pub(super) fn new(sink: Box<dyn FnMut(&str) + Send>) -> Self {
        JunkLog { sink, shown: 0, suppressed: 0 }
    }

    /// Reporting on stderr as warnings, each line after `who: `.
    pub(super) fn stderr(who: String) -> Self {
        Self::new(Box::new(move |line| crate::errln!("warning: {who}: {line}")))
    }

    /// One stranger turned away, `what` saying who and why.
    pub(super) fn note(&mut self, what: &str) {
        if self.shown < SHOWN {
            (self.sink)(what);
            self.shown += 1;
            if self.shown == SHOWN {
                (self.sink)("more connections that are not ranks of this job will be counted, not reported one by one");
            }
        } else {
            self.suppressed = self.suppressed.saturating_add(1);
        }
    }
}

impl Drop for JunkLog {
    /// The summary line, however the listening ends.
    fn drop(&mut self) {
        if self.suppressed > 0 {
            let n = self.suppressed;
            (self.sink)(&format!("... {n} more junk connections ignored"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn capture() -> (JunkLog, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        (JunkLog::new(Box::new(move |s| l.lock().unwrap().push(s.to_string()))), lines)
    }

    #[test]
    fn a_flood_logs_the_first_few_then_one_summary() {
        let (mut log, lines) = capture();
        for i in 0..1000 {
            log.note(&format!("ignored a connection from peer {i}"));
        }
        drop(log);
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), SHOWN + 2, "{lines:?}");
        assert_eq!(lines[0], "ignored a connection from peer 0");
        assert!(lines[SHOWN].contains("counted, not reported one by one"), "{lines:?}");
        assert_eq!(lines[SHOWN + 1], format!("... {} more junk connections ignored", 1000 - SHOWN));
    }

    #[test]
    fn a_few_strangers_are_each_reported_and_nothing_more() {
        let (mut log, lines) = capture();
        log.note("one");
        log.note("two");
        drop(log);
        assert_eq!(*lines.lock().unwrap(), ["one", "two"]);
    }
}
