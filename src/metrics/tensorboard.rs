//! TensorBoard event files (`<out_dir>/tb/`), fed from the same records as
//! `metrics.jsonl`: every number of a `train` record becomes `train/<field>`
//! at its step; every number of an `eval` record becomes `test/<field>` (the
//! `test_` prefix dropped) at its global step too, as PyTorch users log it. New fields (AMP's loss scale and
//! overflow count) appear without changes here.

use crate::error::{Error, Result};
use std::path::Path;
use tensorboard_rs::summary_writer::SummaryWriter;

pub struct TensorBoard {
    writer: SummaryWriter,
}

impl TensorBoard {
    pub fn create(dir: &Path) -> Result<Self> {
        // tensorboard-rs panics on I/O errors (in its writer thread), so
        // everything it will need is checked here first, as an error.
        std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
        let probe = dir.join(format!(".probe.{}", std::process::id()));
        std::fs::write(&probe, b"")
            .map_err(|e| Error::io(format!("cannot write in {}", dir.display()), e))?;
        let _ = std::fs::remove_file(&probe);
        // Event files are named by (second, host, pid): a second writer in the
        // same process and second would truncate the first one's file.
        let pid_suffix = format!(".{}.0", std::process::id());
        let now =
            || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let taken = |t: u64| {
            std::fs::read_dir(dir).is_ok_and(|rd| {
                rd.flatten().any(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with(&format!("events.out.tfevents.{t:010}.")) && n.ends_with(&pid_suffix)
                })
            })
        };
        while taken(now()) {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Ok(TensorBoard { writer: SummaryWriter::new(dir) })
    }

    /// Writes the scalars of one metrics record and flushes them.
    pub fn record(&mut self, record: &serde_json::Value) {
        let (prefix, x) = match record["kind"].as_str() {
            Some("train") => ("train", record["step"].as_u64()),
            // A language model's evaluation is on its validation split.
            Some("eval") if record.get("val_loss").is_some() => ("val", record["step"].as_u64()),
            Some("eval") => ("test", record["step"].as_u64()),
            _ => return,
        };
        let (Some(x), Some(fields)) = (x, record.as_object()) else { return };
        for (k, v) in fields {
            if matches!(k.as_str(), "step" | "epoch") {
                continue;
            }
            if let Some(v) = v.as_f64() {
                let name = k.strip_prefix("test_").or_else(|| k.strip_prefix("val_")).unwrap_or(k);
                self.writer.add_scalar(&format!("{prefix}/{name}"), v as f32, x as usize);
            }
        }
        self.writer.flush();
    }
}
