//! bpftrace (Debian's package) attached beside the agent, counting on the same hooks: the
//! yardstick the benchmarks measure kstall's programs against, in the same run.

use std::{
    io::{BufRead, BufReader, Read as _},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    START_WITHIN,
    bpf::{ProgramRuns, program_runs_of},
};

/// A running bpftrace; killed on drop if not stopped. Its output is read as it comes, so that a
/// script that prints per event never stalls on a full pipe.
pub struct Bpftrace {
    child: Child,
    output: Option<std::thread::JoinHandle<Counted>>,
}

/// What bpftrace counted when stopped: each map's name and its values, one per key (one in all
/// for a map without keys), and how many other lines it printed (a `printf` per event).
#[derive(Debug, Default)]
pub struct Counted {
    maps: Vec<(String, u64)>,
    pub printed: u64,
}

impl Counted {
    /// The sum of map `name`'s values.
    pub fn total(&self, name: &str) -> u64 {
        self.maps.iter().filter(|(m, _)| m == name).map(|(_, n)| n).sum()
    }

    /// How many keys map `name` has: distinct tasks, say.
    pub fn keys(&self, name: &str) -> u64 {
        self.maps.iter().filter(|(m, _)| m == name).count() as u64
    }
}

impl Bpftrace {
    /// Starts `script` and returns once its probes are attached. Classic tracepoints need tracefs
    /// mounted (see [`Tracefs`]).
    pub fn start(script: &str) -> Self {
        Self::try_start(script).unwrap_or_else(|why| panic!("{why}"))
    }

    /// [`Bpftrace::start`], or what bpftrace said when it could not compile or attach `script`
    /// (bpftrace 0.17 cannot read 5.10's tracepoint formats, which use the kernel's `u32`).
    pub fn try_start(script: &str) -> Result<Self, String> {
        let mut child = Command::new("bpftrace")
            .args(["-e", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start bpftrace (apt bpftrace)");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let deadline = Instant::now() + START_WITHIN;
        let mut line = String::new();
        // bpftrace says "Attaching N probes..." before it attaches them; its programs are in the
        // kernel once it holds one per probe.
        stdout.read_line(&mut line).expect("bpftrace's output");
        let probes: usize = line
            .strip_prefix("Attaching ")
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| {
                // It exits when it cannot attach: what it said is on its standard error.
                let mut said = String::new();
                let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut said));
                let _ = child.wait();
                format!("bpftrace did not start `{script}`: {line:?} {}", said.trim())
            })?;
        // Drained, so that its warnings never fill the pipe and stall it.
        if let Some(mut stderr) = child.stderr.take() {
            std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        }
        let output = std::thread::spawn(move || read_output(stdout));
        let trace = Bpftrace { child, output: Some(output) };
        while trace.programs().len() < probes {
            assert!(Instant::now() < deadline, "bpftrace did not attach {probes} probes");
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(trace)
    }

    pub fn programs(&self) -> Vec<ProgramRuns> {
        program_runs_of(self.child.id())
    }

    /// Stops it (SIGINT, as a user's Ctrl-C) and reads the maps it prints on the way out.
    pub fn stop(mut self) -> Counted {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let counted = self.output.take().expect("read once").join().expect("bpftrace's output");
        let _ = self.child.wait();
        counted
    }
}

/// Its output to the end: the maps it prints on the way out, and a count of every other line
/// after the first ("Attaching N probes...", read by `try_start`).
fn read_output(mut stdout: impl BufRead) -> Counted {
    let mut counted = Counted::default();
    let mut line = String::new();
    while stdout.read_line(&mut line).is_ok_and(|n| n > 0) {
        match map_line(line.trim_end()) {
            Some(map) => counted.maps.push(map),
            None if !line.trim().is_empty() => counted.printed += 1,
            None => {}
        }
        line.clear();
    }
    counted
}

impl Drop for Bpftrace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `@name: 12` or `@name[key]: 12` as (name, 12).
fn map_line(line: &str) -> Option<(String, u64)> {
    let (map, value) = line.strip_prefix('@')?.rsplit_once(": ")?;
    let name = map.split_once('[').map_or(map, |(name, _)| name);
    Some((name.to_string(), value.trim().parse().ok()?))
}

/// tracefs mounted at /sys/kernel/tracing while the guard lives (unmounted on drop only if this
/// mounted it): bpftrace attaches classic tracepoints through it.
pub struct Tracefs {
    mounted: bool,
}

impl Tracefs {
    pub fn mount() -> Self {
        const AT: &str = "/sys/kernel/tracing";
        if std::path::Path::new(AT).join("events").exists() {
            return Tracefs { mounted: false };
        }
        crate::host::run("mount", &["-t", "tracefs", "tracefs", AT]);
        Tracefs { mounted: true }
    }
}

impl Drop for Tracefs {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("/sys/kernel/tracing").status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_with_and_without_keys_are_read() {
        let out = "\n\n@stuck[4242]: 7\n@stuck[4243]: 1\n@sent: 30\nsomething else\n";
        let counted = read_output(BufReader::new(out.as_bytes()));
        assert_eq!(counted.total("sent"), 30);
        assert_eq!(counted.keys("stuck"), 2);
        assert_eq!(counted.total("stuck"), 8);
        assert_eq!(counted.total("received"), 0);
        assert_eq!(counted.printed, 1, "one line that is no map's");
    }
}
