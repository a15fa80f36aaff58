//! The kernel's hung-task detector, which this probe reports from: its timeout lowered while the
//! probe runs when asked (`--hung-task-timeout-secs`), and what it is set to, in the probe's
//! status — a probe that is up but whose detector is off would otherwise look healthy and
//! report nothing.

use aya::Ebpf;

use crate::probes::{plan::ProbeStatus, probe::Completion};

const TIMEOUT: &str = "/proc/sys/kernel/hung_task_timeout_secs";

fn timeout_secs() -> Option<u64> {
    std::fs::read_to_string(TIMEOUT).ok()?.trim().parse().ok()
}

/// `kernel.hung_task_timeout_secs` lowered on request, put back on drop.
struct Lowered {
    previous: u64,
}

impl Lowered {
    fn set(secs: u64) -> std::io::Result<Self> {
        let previous = timeout_secs().ok_or_else(|| std::io::Error::other("cannot read it"))?;
        std::fs::write(TIMEOUT, secs.to_string())?;
        tracing::warn!(
            previous,
            now = secs,
            "set kernel.hung_task_timeout_secs as asked by --hung-task-timeout-secs; restored at exit"
        );
        Ok(Self { previous })
    }
}

impl Drop for Lowered {
    fn drop(&mut self) {
        match std::fs::write(TIMEOUT, self.previous.to_string()) {
            Ok(()) => tracing::info!(value = self.previous, "restored kernel.hung_task_timeout_secs"),
            Err(e) => {
                tracing::error!(error = %e, value = self.previous, "cannot restore kernel.hung_task_timeout_secs")
            }
        }
    }
}

/// The detector as the probe found it, and the timeout it lowered (held until the agent stops).
pub struct Detector {
    lowered: Result<Option<Lowered>, String>,
    /// Whether the sampler (stuck-task) is loaded too: it finds stuck tasks with the detector off.
    sampling: bool,
}

impl Detector {
    /// Lowers the timeout to `secs` if asked; a sysctl that cannot be written (read-only in a
    /// pod) leaves the node's setting, and the probe's status says so.
    pub fn new(secs: Option<u64>, sampling: bool) -> Self {
        let lowered = secs.map(Lowered::set).transpose().map_err(|e| {
            tracing::warn!(error = %e, "cannot set kernel.hung_task_timeout_secs; hung tasks are reported after the node's own setting");
            format!("cannot set it to {} (--hung-task-timeout-secs): {e}", secs.unwrap_or_default())
        });
        Self { lowered, sampling }
    }

    fn note(&self) -> String {
        match (timeout_secs(), &self.lowered) {
            (Some(0), _) if self.sampling => {
                "detector disabled (kernel.hung_task_timeout_secs=0): this probe reports \
                 nothing; stuck-task (the sampler) still finds stuck tasks"
                    .to_string()
            }
            (Some(0), _) => {
                "detector disabled (kernel.hung_task_timeout_secs=0): no hung task will be reported"
                    .to_string()
            }
            (Some(now), Ok(Some(l))) => {
                format!("detector: kernel.hung_task_timeout_secs={now} (set by kstall, was {})", l.previous)
            }
            (Some(now), Ok(None)) => format!("detector: kernel.hung_task_timeout_secs={now}"),
            (Some(now), Err(e)) => format!("detector: kernel.hung_task_timeout_secs={now} ({e})"),
            (None, _) => "detector: kernel.hung_task_timeout_secs unreadable".to_string(),
        }
    }
}

impl Completion for Detector {
    fn on_load(&mut self, _: &mut Ebpf, status: &mut ProbeStatus) {
        if status.up {
            status.notes.push(self.note());
        } else {
            // Nothing reports what the detector finds: the node's setting is put back at once.
            self.lowered = Ok(None);
        }
    }

    fn waiting(&self) -> bool {
        false
    }

    fn on_modules(&mut self, _: &mut Ebpf, _: &mut ProbeStatus) -> bool {
        false
    }
}
