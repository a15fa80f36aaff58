//! A pod's stuck tasks as `/proc` shows them: every task of its processes in D state (the
//! uninterruptible sleep, killable or not), at most [`MAX_TASKS`], with its name, where it sleeps
//! (`wchan`) and its kernel stack, classified as kstall's probes classify theirs. Only `stat`,
//! `wchan` and `stack` are read, each through [`bounded`]: never `cmdline` or `environ`, which
//! wait on a stuck task's memory lock (and hold what kstall does not keep).

use std::{fmt::Write as _, path::Path};

use serde::Serialize;

use super::{
    FileNote, FileStatus,
    bounded::{self, Bounded},
    nfs::WITHIN,
    write_new,
};
use crate::probes::wait::{WaitClass, classify};

/// The most tasks written: a pod of thousands of threads all stuck says enough with these.
pub const MAX_TASKS: usize = 1024;
const STAT_LIMIT: u64 = 4 << 10;
const STACK_LIMIT: u64 = 64 << 10;

/// What [`collect`] wrote and found.
#[derive(Debug)]
pub struct Collected {
    pub notes: Vec<FileNote>,
    /// Tasks in D state, those past [`MAX_TASKS`] too.
    pub stuck: usize,
}

#[derive(Debug, Serialize)]
struct Task {
    pid: u32,
    tid: u32,
    comm: String,
    state: String,
    /// Where it sleeps, as `/proc/…/wchan` names it (`0` when the kernel hides it).
    wchan: Option<String>,
    /// The wait class of its stack, when the stack could be read.
    wait: Option<WaitClass>,
    /// Innermost frame first, as the kernel prints them: `folio_wait_bit_common+0x13f/0x340`.
    stack: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stack_error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Report {
    processes: usize,
    /// Tasks in D state, those past the cap too.
    stuck: usize,
    tasks: Vec<Task>,
    /// Tasks whose state could not be read, one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unread: Vec<String>,
}

/// Writes the tasks of `pids` (processes of `proc`, a `/proc`) in D state into
/// `dir/tasks/stuck.txt` and `dir/tasks/stuck.json`.
pub fn collect(proc: &Path, pids: &[u32], dir: &Path) -> Result<Collected, String> {
    let mut report = Report { processes: pids.len(), stuck: 0, tasks: Vec::new(), unread: Vec::new() };
    for &pid in pids {
        for tid in tids(proc, pid) {
            let base = proc.join(format!("{pid}/task/{tid}"));
            let stat = match bounded::read_text(&base.join("stat"), STAT_LIMIT, WITHIN) {
                Ok(stat) => stat,
                // It ended since it was listed.
                Err(Bounded::Io(std::io::ErrorKind::NotFound, _)) => continue,
                Err(e) => {
                    report.unread.push(format!("{}/stat: {e}", base.display()));
                    continue;
                }
            };
            let Some((comm, state)) = parse_stat(&stat) else { continue };
            if state != "D" {
                continue;
            }
            report.stuck += 1;
            if report.tasks.len() == MAX_TASKS {
                continue;
            }
            let wchan = bounded::read_text(&base.join("wchan"), STAT_LIMIT, WITHIN).ok();
            let (stack, stack_error) = match bounded::read_text(&base.join("stack"), STACK_LIMIT, WITHIN) {
                Ok(text) => (frames(&text), None),
                Err(Bounded::Io(std::io::ErrorKind::PermissionDenied, _)) => {
                    (Vec::new(), Some(format!("{}/stack needs CAP_SYS_ADMIN", base.display())))
                }
                Err(e) => (Vec::new(), Some(format!("{}/stack: {e}", base.display()))),
            };
            let wait = (!stack.is_empty()).then(|| classify(stack.iter().map(String::as_str)));
            report.tasks.push(Task {
                pid,
                tid,
                comm: comm.to_string(),
                state: state.to_string(),
                wchan,
                wait,
                stack,
                stack_error,
            });
        }
    }
    let (status, error) = match (report.stuck > report.tasks.len(), report.unread.len()) {
        (false, 0) => (FileStatus::Complete, None),
        (cut, unread) => {
            let mut why = Vec::new();
            if cut {
                why.push(format!("{} tasks in D state: the first {MAX_TASKS} written", report.stuck));
            }
            if unread > 0 {
                why.push(format!("the state of {unread} tasks could not be read"));
            }
            (FileStatus::Partial, Some(why.join("; ")))
        }
    };
    let json = serde_json::to_vec_pretty(&report).map_err(|e| format!("tasks/stuck.json: {e}"))?;
    write_new(dir, "tasks/stuck.txt", text(&report, error.as_deref()).as_bytes())?;
    write_new(dir, "tasks/stuck.json", &json)?;
    let what = |form: &str| format!("the pod's tasks in D state with their kernel stacks, {form}");
    let note = |path: &str, what: String| FileNote { path: path.into(), what, status, error: error.clone() };
    Ok(Collected {
        notes: vec![note("tasks/stuck.txt", what("as text")), note("tasks/stuck.json", what("as JSON"))],
        stuck: report.stuck,
    })
}

/// The task ids of `pid`, in order; none if it ended.
fn tids(proc: &Path, pid: u32) -> Vec<u32> {
    let mut tids: Vec<u32> = std::fs::read_dir(proc.join(format!("{pid}/task")))
        .map(|dir| dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    tids.sort_unstable();
    tids
}

/// The name and state of a task's `stat` (`pid (comm) S ppid …`): the name may hold spaces and
/// parentheses, so it ends at the last `)`.
fn parse_stat(stat: &str) -> Option<(&str, &str)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1;
    Some((comm, rest.split_whitespace().next()?))
}

/// The frames of a `/proc/…/stack` (`[<0>] folio_wait_bit_common+0x13f/0x340`), innermost first.
fn frames(stack: &str) -> Vec<String> {
    stack
        .lines()
        .map(|line| line.split_once("] ").map_or(line, |(_, frame)| frame).trim())
        .filter(|frame| !frame.is_empty())
        .map(str::to_string)
        .collect()
}

fn text(report: &Report, error: Option<&str>) -> String {
    let mut text = format!(
        "# tasks in D state (uninterruptible or killable sleep) of the pod's {} processes: {}\n",
        report.processes, report.stuck
    );
    if let Some(error) = error {
        let _ = writeln!(text, "# partial: {error}");
    }
    for line in &report.unread {
        let _ = writeln!(text, "# {line}");
    }
    for task in &report.tasks {
        let _ = writeln!(
            text,
            "pid {} tid {} comm {:?} state {} wchan {} wait {}",
            task.pid,
            task.tid,
            task.comm,
            task.state,
            task.wchan.as_deref().unwrap_or("?"),
            task.wait.map_or("?", WaitClass::as_str)
        );
        for frame in &task.stack {
            let _ = writeln!(text, "    {frame}");
        }
        if let Some(e) = &task.stack_error {
            let _ = writeln!(text, "    ({e})");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_the_name_and_state() {
        assert_eq!(parse_stat("4242 (dd) D 1 4242 4242 0 -1"), Some(("dd", "D")));
        assert_eq!(parse_stat("77 (a (b) c) S 1 77"), Some(("a (b) c", "S")));
        assert_eq!(parse_stat("77 (x"), None);
        assert_eq!(
            frames("[<0>] folio_wait_bit_common+0x13f/0x340\n[<0>] nfs_file_fsync+0x2e/0x1c0 [nfs]\n"),
            ["folio_wait_bit_common+0x13f/0x340", "nfs_file_fsync+0x2e/0x1c0 [nfs]"]
        );
    }

    /// A fake `/proc`: process 4242 with a sleeping thread and one in D waiting on NFS, and
    /// process 5151 with one thread in D whose stack says nothing.
    fn fake_proc() -> tempfile::TempDir {
        let proc = tempfile::tempdir().unwrap();
        let task = |pid: u32, tid: u32, stat: &str, stack: &str| {
            let base = proc.path().join(format!("{pid}/task/{tid}"));
            std::fs::create_dir_all(&base).unwrap();
            std::fs::write(base.join("stat"), stat).unwrap();
            std::fs::write(base.join("wchan"), "rpc_wait_bit_killable").unwrap();
            std::fs::write(base.join("stack"), stack).unwrap();
        };
        task(4242, 4242, "4242 (writer) S 1 4242", "[<0>] do_select+0x1/0x2\n");
        task(
            4242,
            4250,
            "4250 (writer (io)) D 1 4242",
            "[<0>] rpc_wait_bit_killable+0x1d/0x90 [sunrpc]\n[<0>] __rpc_execute+0x10c/0x3e0 [sunrpc]\n\
             [<0>] nfs4_run_open_task+0x150/0x1f0 [nfsv4]\n",
        );
        task(5151, 5151, "5151 (sh) D 1 5151", "");
        proc
    }

    #[test]
    fn the_tasks_in_d_state_are_written_with_their_stacks() {
        let proc = fake_proc();
        let out = tempfile::tempdir().unwrap();
        // 6 is gone.
        let found = collect(proc.path(), &[4242, 5151, 6], out.path()).unwrap();
        assert_eq!(found.stuck, 2);
        assert_eq!(found.notes.len(), 2);
        assert!(found.notes.iter().all(|n| n.status == FileStatus::Complete), "{:?}", found.notes);
        let text = std::fs::read_to_string(out.path().join("tasks/stuck.txt")).unwrap();
        assert_eq!(
            text,
            "# tasks in D state (uninterruptible or killable sleep) of the pod's 3 processes: 2\n\
             pid 4242 tid 4250 comm \"writer (io)\" state D wchan rpc_wait_bit_killable wait nfs\n    \
             rpc_wait_bit_killable+0x1d/0x90 [sunrpc]\n    __rpc_execute+0x10c/0x3e0 [sunrpc]\n    \
             nfs4_run_open_task+0x150/0x1f0 [nfsv4]\n\
             pid 5151 tid 5151 comm \"sh\" state D wchan rpc_wait_bit_killable wait ?\n"
        );
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.path().join("tasks/stuck.json")).unwrap()).unwrap();
        assert_eq!(json["stuck"], 2);
        assert_eq!(json["tasks"][0]["tid"], 4250);
        assert_eq!(json["tasks"][0]["wait"], "nfs");
        assert_eq!(json["tasks"][0]["stack"][1], "__rpc_execute+0x10c/0x3e0 [sunrpc]");
        assert_eq!(json["tasks"][1]["wait"], serde_json::Value::Null);
    }
}
