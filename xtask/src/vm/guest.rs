//! What a guest of the kernel matrix is given of this checkout and told to run. Nothing is left to
//! the host's root file system that an amd64 guest also sees: virtme-ng's init mounts a tmpfs over
//! the guest's /var/tmp, which hid a checkout there (issue 54). The checkout is shared read-only at
//! its own path and the boot's output directory read-write at [`OUT`], a short path of the guest's
//! own: virtme-ng passes the shares and the command on the kernel command line, which takes 2048
//! bytes, and a boot whose command line would be longer fails with a line saying so, unbooted.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context as _;

use crate::build;

/// Where the guest finds this boot's output directory (`target/vm/out/<boot>`), which holds the
/// script it runs.
const OUT: &str = "/tmp/kstall-out";

/// How a guest says it cannot see a path it was told to run.
const UNSEEN: &str = "kstall-vm: the guest cannot see ";

/// The kernel command line's room on x86 and arm64 (`COMMAND_LINE_SIZE`, less its NUL): what is
/// past it is cut, and the guest's init never finds its command.
const COMMAND_LINE_MAX: usize = 2047;

/// Where one boot's guest sees this checkout: at its path here, or bound under another directory.
pub struct Checkout {
    elsewhere: Option<PathBuf>,
}

impl Checkout {
    pub fn here() -> Self {
        Checkout { elsewhere: None }
    }

    /// This checkout as if it were under `dir` (to prove a checkout there works): an empty
    /// directory there, on which the checkout is bound in the VM's own mount namespace
    /// ([`Checkout::enter`]) — vng is given the paths it would be given for a checkout there, and
    /// nothing is left to undo on this machine but the directory, removed on drop.
    pub fn under(dir: &str, boot: &str) -> anyhow::Result<Self> {
        let at = Path::new(dir).join(format!("kstall-checkout.{boot}"));
        std::fs::create_dir_all(&at).with_context(|| format!("create {}", at.display()))?;
        Ok(Checkout { elsewhere: Some(at) })
    }

    /// Where the guest finds `path`, a path in this checkout.
    pub fn path(&self, path: &Path) -> PathBuf {
        match (&self.elsewhere, path.strip_prefix(build::workspace_root())) {
            (Some(at), Ok(inside)) => at.join(inside),
            _ => path.to_path_buf(),
        }
    }

    pub fn elsewhere(&self) -> Option<&Path> {
        self.elsewhere.as_deref()
    }

    /// `vm`'s next program runs in a mount namespace of its own with the checkout bound where the
    /// guest sees it, when that is elsewhere.
    pub fn enter(&self, vm: &mut Command) {
        if let Some(at) = &self.elsewhere {
            vm.args(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c"])
                .arg(r#"mount --bind "$1" "$2" && shift 2 && exec "$@""#)
                .arg("sh")
                .arg(build::workspace_root())
                .arg(at);
        }
    }

    /// vng's arguments sharing the checkout and `out` with the guest. A guest with a root of its
    /// own (arm64) gets their mount points made in it: virtme-ng mounts only over directories
    /// that exist there.
    pub fn share(&self, vm: &mut Command, out: &Path, root: Option<&Path>) -> anyhow::Result<()> {
        let checkout = self.path(&build::workspace_root());
        if let Some(root) = root {
            for dir in [Path::new(OUT), &checkout] {
                let inside = root.join(dir.strip_prefix("/").context("an absolute path")?);
                std::fs::create_dir_all(&inside).with_context(|| format!("create {}", inside.display()))?;
            }
        }
        vm.arg("--rwdir").arg(format!("{OUT}={}", self.path(out).display()));
        vm.arg("--rodir").arg(format!("{0}={0}", checkout.display()));
        Ok(())
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if let Some(at) = &self.elsewhere {
            let _ = std::fs::remove_dir(at);
        }
    }
}

/// What the guest runs, as each path is seen from it.
pub struct Run<'a> {
    pub kstall: &'a Path,
    pub scenarios: &'a Path,
    pub timeout_secs: u32,
    /// The scenarios' filter, as libtest takes it.
    pub filter: &'a str,
    /// A bpftrace script that counts the agent's system calls while the guest runs
    /// (`cargo xtask seccomp record`); its counts end in `syscalls.bt`, the guest's machine in
    /// `machine`.
    pub syscall_recorder: Option<&'a str>,
}

/// Writes the guest's script and what it runs into `out` (this boot's output directory, shared
/// with the guest at [`OUT`]); returns the command vng gives the guest, which runs the script —
/// or, if the guest cannot see it, says so (an [`UNSEEN`] line) and exits 127.
pub fn prepare(out: &Path, checkout: &Checkout, run: &Run) -> anyhow::Result<String> {
    let vm_dir = build::workspace_root().join("target/vm");
    let settings = [
        ("KSTALL", checkout.path(run.kstall).display().to_string()),
        ("SCENARIOS", checkout.path(run.scenarios).display().to_string()),
        ("WORKSPACE", checkout.path(&build::workspace_root()).display().to_string()),
        ("LOCKUP_MODULES", checkout.path(&vm_dir.join("lockup-module")).display().to_string()),
        ("TIMEOUT", run.timeout_secs.to_string()),
        ("FILTER", run.filter.to_string()),
        ("RECORD_SYSCALLS", if run.syscall_recorder.is_some() { "1" } else { "" }.to_string()),
    ];
    let settings: String =
        settings.iter().map(|(name, value)| format!("{name}={}\n", quoted(value))).collect();
    std::fs::write(out.join("guest.env"), settings).context("write the guest's settings")?;
    std::fs::write(out.join("guest.sh"), SCRIPT).context("write the guest script")?;
    if let Some(recorder) = run.syscall_recorder {
        std::fs::write(out.join("recorder.bt"), recorder).context("write the system call recorder")?;
    }
    Ok(command(&Path::new(OUT).join("guest.sh")))
}

fn command(script: &Path) -> String {
    let script = quoted(&script.display().to_string());
    format!("[ -e {script} ] && exec bash {script}; echo \"{UNSEEN}\"{script}; exit 127")
}

/// `value` as one word of a shell command.
fn quoted(value: &str) -> String {
    format!("'{}'", value.replace('\'', r#"'\''"#))
}

/// The paths the guest said it could not see, from its console.
pub fn unseen(console: &str) -> Vec<&str> {
    console.lines().filter_map(|l| l.trim_end_matches('\r').strip_prefix(UNSEEN)).collect()
}

/// Why the guest kernel's command line vng would give (`dry_run`: what `vng --dry-run` printed)
/// is too long for it, if it is.
pub fn command_line_too_long(dry_run: &str) -> Option<String> {
    let append = dry_run.split_once("-append '")?.1.split_once('\'')?.0;
    (append.len() > COMMAND_LINE_MAX).then(|| {
        format!(
            "the guest kernel's command line would be {} bytes, over the {COMMAND_LINE_MAX} it takes: \
             the checkout's path ({} bytes) is in it twice; move the checkout to a shorter path",
            append.len(),
            build::workspace_root().as_os_str().len()
        )
    })
}

/// Runs inside the VM as root from [`OUT`]: checks that it sees what it runs (an [`UNSEEN`] line
/// on the console and exit 127 if not); loads the modules the NFS and tcp-reset probes wait for
/// (the first NFS mount and the first NAT rule load them on a node), runs the agent until its
/// module watcher has attached everything and saves its status; then runs the scenario tests,
/// each of which starts its own agent.
const SCRIPT: &str = r#"#!/bin/bash
OUT=$(dirname "$0")
. "$OUT/guest.env"
for path in "$KSTALL" "$SCENARIOS" "$WORKSPACE"; do
    [ -e "$path" ] || { echo "kstall-vm: the guest cannot see $path"; exit 127; }
done
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing
# Recording: bpftrace runs this script again once its probes are attached (-c) and writes the
# counts when that ends; if it cannot start, its error is on the console and no run is done.
if [ -n "$RECORD_SYSCALLS" ] && [ -z "$KSTALL_RECORDING" ]; then
    uname -m > "$OUT/machine"
    KSTALL_RECORDING=1 exec bpftrace -q -o "$OUT/syscalls.bt" -c "/bin/bash $0" "$OUT/recorder.bt"
fi
exec > "$OUT/guest.log" 2>&1
cut -d' ' -f1 /proc/uptime > "$OUT/boot_secs"
modprobe sunrpc; modprobe nfsv4; modprobe nf_conntrack
SOCK=/tmp/kstall.sock
"$KSTALL" agent --listen 127.0.0.1:9700 --api-socket "$SOCK" --log-format json > "$OUT/agent.log" 2>&1 &
AGENT=$!
# Until every probe is up — the module watcher attaches what waited for sunrpc, nfsv4 and
# nf_conntrack — or 3 minutes have passed (by the clock: under emulation one round of status
# takes a second or more), when status.json says what is down.
DEADLINE=$(( $(cut -d. -f1 /proc/uptime) + 180 ))
while [ "$(cut -d. -f1 /proc/uptime)" -lt "$DEADLINE" ]; do
    "$KSTALL" status --api-socket "$SOCK" --output json > "$OUT/status.json" 2>/dev/null &&
        ! grep -q '"up": false' "$OUT/status.json" && break
    sleep 1
done
kill -TERM "$AGENT"; wait "$AGENT"
echo "agent exit $?" >> "$OUT/guest.log"
START=$(cut -d' ' -f1 /proc/uptime)
KSTALL_VM_GUEST=1 KSTALL_KERNEL_TESTS=require KSTALL_BIN="$KSTALL" KSTALL_WORKSPACE="$WORKSPACE" \
    KSTALL_LOCKUP_MODULE="$LOCKUP_MODULES/$(uname -r)/kstall_spin.ko" \
    timeout "$TIMEOUT" "$SCENARIOS" --ignored --test-threads=1 --show-output $FILTER > "$OUT/scenarios.log" 2>&1
echo $? > "$OUT/scenarios.rc"
awk -v start="$START" '{ print $1 - start }' /proc/uptime > "$OUT/scenarios_secs"
dmesg > "$OUT/dmesg.log"
touch "$OUT/done"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `out`'s guest script as the guest would (its command), but from `out` itself.
    fn run_as_the_guest(out: &Path) -> (Option<i32>, String) {
        let command = command(&out.join("guest.sh"));
        let ran = Command::new("bash").arg("-c").arg(command).output().unwrap();
        (ran.status.code(), String::from_utf8_lossy(&ran.stdout).into_owned())
    }

    #[test]
    fn a_guest_that_cannot_see_what_it_runs_names_it_on_its_console() {
        let out = tempfile::tempdir().unwrap();
        let (code, console) = run_as_the_guest(out.path());
        let script = out.path().join("guest.sh");
        assert_eq!((code, unseen(&console)), (Some(127), vec![script.to_str().unwrap()]), "{console}");

        let kstall = out.path().join("not shared/kstall");
        let run = Run {
            kstall: &kstall,
            scenarios: out.path(),
            timeout_secs: 1200,
            filter: "a_b --exact",
            syscall_recorder: None,
        };
        prepare(out.path(), &Checkout::here(), &run).unwrap();
        let (code, console) = run_as_the_guest(out.path());
        assert_eq!((code, unseen(&console)), (Some(127), vec![kstall.to_str().unwrap()]), "{console}");
        assert!(!out.path().join("boot_secs").exists(), "stopped before it began");

        let console = "booting\r\nkstall-vm: the guest cannot see /var/tmp/x/guest.sh\r\n";
        assert_eq!(unseen(console), ["/var/tmp/x/guest.sh"], "a serial console's line ends");
    }

    #[test]
    fn the_guest_reads_its_settings_back_as_written() {
        let out = tempfile::tempdir().unwrap();
        let filter = "it's a --skip b";
        let run = Run {
            kstall: out.path(),
            scenarios: out.path(),
            timeout_secs: 1200,
            filter,
            syscall_recorder: None,
        };
        prepare(out.path(), &Checkout::here(), &run).unwrap();
        let env = out.path().join("guest.env");
        let read = Command::new("bash")
            .arg("-c")
            .arg(r#". "$1"; printf '%s|' "$KSTALL" "$TIMEOUT" "$FILTER" "$LOCKUP_MODULES""#)
            .arg("bash")
            .arg(&env)
            .output()
            .unwrap();
        let vm_dir = build::workspace_root().join("target/vm/lockup-module");
        let expected = format!("{0}|1200|{filter}|{1}|", out.path().display(), vm_dir.display());
        assert_eq!(String::from_utf8_lossy(&read.stdout), expected);
    }

    #[test]
    fn a_path_in_the_checkout_is_found_where_the_guest_sees_the_checkout() {
        let root = build::workspace_root();
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = Checkout::under(dir.path().to_str().unwrap(), "6.1").unwrap();
        let at = dir.path().join("kstall-checkout.6.1");
        assert!(at.is_dir());
        assert_eq!(elsewhere.path(&root.join("target/vm/out")), at.join("target/vm/out"));
        assert_eq!(
            elsewhere.path(Path::new("/boot/vmlinuz")),
            Path::new("/boot/vmlinuz"),
            "not the checkout's"
        );
        assert_eq!(Checkout::here().path(&root.join("tests")), root.join("tests"));
        drop(elsewhere);
        assert!(!at.exists(), "its directory is removed with it");
    }

    #[test]
    fn a_command_line_past_the_kernels_room_is_refused_with_its_length() {
        let dry_run =
            |append: &str| format!("/usr/bin/qemu-system-x86_64 -m 1G -append '{append}' -initrd /x\n");
        assert_eq!(command_line_too_long(&dry_run(&"x".repeat(COMMAND_LINE_MAX))), None);
        let why = command_line_too_long(&dry_run(&"x".repeat(2300))).expect("too long");
        assert!(
            why.starts_with("the guest kernel's command line would be 2300 bytes, over the 2047"),
            "{why}"
        );
    }
}
