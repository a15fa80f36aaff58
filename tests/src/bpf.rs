//! The kernel's BPF programs: which ones a process holds, which are loaded (as bpftool lists
//! them), and whether released ones are gone.

use std::{
    collections::BTreeSet,
    io::ErrorKind,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::host::run;

/// Ids of the BPF programs process `pid` holds, in the kernel's own view of it: each program fd
/// and link fd has a `prog_id:` line in `/proc/<pid>/fdinfo/<fd>`. An fd closed while they are
/// read is skipped; no such process is an empty set.
pub fn program_ids_of(pid: u32) -> BTreeSet<u64> {
    let dir = format!("/proc/{pid}/fdinfo");
    let fds = match std::fs::read_dir(&dir) {
        Ok(fds) => fds,
        Err(e) if e.kind() == ErrorKind::NotFound => return BTreeSet::new(),
        Err(e) => panic!("{dir}: {e}"),
    };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .filter_map(|fdinfo| prog_id(&fdinfo))
        .collect()
}

/// Program id -> the instructions the verifier walked to load it (`verified_insns:`, 5.16+), for
/// each program fd process `pid` holds: what a program costs at every start of the agent.
pub fn verified_instructions_of(pid: u32) -> std::collections::BTreeMap<u64, u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return Default::default() };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .filter_map(|fdinfo| {
            let verified =
                fdinfo.lines().find_map(|l| l.strip_prefix("verified_insns:")?.trim().parse().ok())?;
            Some((prog_id(&fdinfo)?, verified))
        })
        .collect()
}

/// The `prog_id` of an fdinfo: a BPF program's or link's.
fn prog_id(fdinfo: &str) -> Option<u64> {
    fdinfo.lines().find_map(|line| line.strip_prefix("prog_id:")?.trim().parse().ok())
}

/// Ids of every BPF program loaded in the kernel.
pub fn loaded_program_ids() -> BTreeSet<u64> {
    bpftool_programs().iter().filter_map(|p| p["id"].as_u64()).collect()
}

/// Which of `ids` are still loaded 5 s on (the kernel frees a released program after an RCU
/// grace period).
pub fn still_loaded_after_grace(ids: &BTreeSet<u64>) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<u64> = loaded_program_ids().intersection(ids).copied().collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// BPF programs whose (15-character) kernel name starts with one of `names`, as bpftool's JSON.
pub fn bpf_programs(names: &[&str]) -> Vec<Value> {
    bpftool_programs()
        .into_iter()
        .filter(|p| names.iter().any(|n| p["name"].as_str().is_some_and(|s| s.starts_with(n))))
        .collect()
}

/// A program's run time in the kernel so far (`kernel.bpf_stats_enabled` must be on for it to grow).
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramRuns {
    pub id: u64,
    /// The kernel's name (15 characters at most) or, for a classic tracepoint program, the
    /// tracepoint it is attached to.
    pub name: String,
    pub run_time_ns: u64,
    pub runs: u64,
}

impl ProgramRuns {
    /// What ran between `before` (an earlier reading of the same programs) and this one.
    pub fn since(&self, before: &[ProgramRuns]) -> ProgramRuns {
        let earlier = before.iter().find(|b| b.id == self.id);
        ProgramRuns {
            run_time_ns: self.run_time_ns - earlier.map_or(0, |b| b.run_time_ns),
            runs: self.runs - earlier.map_or(0, |b| b.runs),
            ..self.clone()
        }
    }

    pub fn ns_per_run(&self) -> f64 {
        self.run_time_ns as f64 / self.runs.max(1) as f64
    }

    /// Whether this program and `other` run on the same hook: a kernel name is the hook's name
    /// cut to 15 characters, or the hook's name with a suffix (`mark_victim_pid`).
    pub fn same_hook(&self, other: &ProgramRuns) -> bool {
        self.name.starts_with(&other.name) || other.name.starts_with(&self.name)
    }
}

/// The programs process `pid` holds and what they have run so far. Programs attached to a classic
/// tracepoint (as bpftrace's are) are named after it, from `bpftool perf show`.
pub fn program_runs_of(pid: u32) -> Vec<ProgramRuns> {
    let ids = program_ids_of(pid);
    let perf: Value =
        serde_json::from_str(&run("bpftool", &["perf", "show", "--json"])).expect("bpftool json");
    let tracepoint_of = |id: u64| {
        perf.as_array()?
            .iter()
            .find(|p| p["prog_id"].as_u64() == Some(id))
            .and_then(|p| p["tracepoint"].as_str())
            .map(str::to_string)
    };
    bpftool_programs()
        .iter()
        .filter_map(|p| {
            let id = p["id"].as_u64().filter(|id| ids.contains(id))?;
            Some(ProgramRuns {
                id,
                name: tracepoint_of(id).unwrap_or_else(|| p["name"].as_str().unwrap_or("").to_string()),
                run_time_ns: p["run_time_ns"].as_u64().unwrap_or(0),
                runs: p["run_cnt"].as_u64().unwrap_or(0),
            })
        })
        .collect()
}

/// `bpftool prog show --json`: every loaded program.
fn bpftool_programs() -> Vec<Value> {
    let progs: Value =
        serde_json::from_str(&run("bpftool", &["prog", "show", "--json"])).expect("bpftool json");
    progs.as_array().expect("bpftool prints an array").clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_or_link_fdinfo_names_its_program() {
        let prog = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nprog_type:\t26\nprog_jited:\t1\n\
                    prog_tag:\t4ee3c3ff8fe5f6d2\nmemlock:\t4096\nprog_id:\t412\nrun_time_ns:\t0\nrun_cnt:\t0\n";
        let link = "pos:\t0\nflags:\t02000000\nmnt_id:\t15\nino:\t1057\nlink_type:\ttracing\nlink_id:\t37\n\
                    prog_tag:\t4ee3c3ff8fe5f6d2\nprog_id:\t412\nattach_type:\t24\n";
        assert_eq!(prog_id(prog), Some(412));
        assert_eq!(prog_id(link), Some(412));
    }

    #[test]
    fn other_fds_name_no_program() {
        let map = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nmap_type:\t27\nkey_size:\t0\n\
                   value_size:\t0\nmax_entries:\t262144\nmap_flags:\t0x0\nmap_extra:\t0x0\nmemlock:\t266240\n\
                   map_id:\t88\nfrozen:\t0\n";
        assert_eq!(prog_id(map), None);
        assert_eq!(prog_id("pos:\t0\nflags:\t0100002\nmnt_id:\t25\nino:\t3\n"), None);
    }

    #[test]
    fn a_process_without_programs_or_without_a_process_holds_none() {
        assert_eq!(program_ids_of(std::process::id()), BTreeSet::new());
        assert_eq!(program_ids_of(u32::MAX), BTreeSet::new());
    }
}
