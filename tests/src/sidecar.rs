//! A pod's sidecar proxy as a process: run as the mesh's user (whom the pod's redirect exempts) in
//! the pod's network namespace and cgroup, in a process group of its own that takes its forked
//! connections too, and SIGKILLed with that group on drop, as when the sidecar container is gone.
//! The stand-ins for Envoy (socat relaying NFS, `mesh_proxy`) run in it.

use std::{
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::{host::wait_for, netns::NetNs};

pub struct SidecarProcess {
    child: Child,
}

impl SidecarProcess {
    /// Runs `program args` as `uid` in `netns`, joined to the pod cgroup whose `cgroup.procs` is
    /// `procs`; returns once each of `ports` has a listening socket.
    pub fn start(netns: &NetNs, procs: &Path, uid: u32, program: &str, args: &[&str], ports: &[u16]) -> Self {
        let child = Command::new("nsenter")
            .arg(format!("--net={}", netns.path().display()))
            .args(["setpriv", &format!("--reuid={uid}"), &format!("--regid={uid}"), "--clear-groups"])
            .arg(program)
            .args(args)
            // Its complaints (socat's "Broken pipe" as a server restarts) would land inside
            // libtest's result lines.
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start the sidecar {program}: {e}"));
        std::fs::write(procs, child.id().to_string()).expect("the sidecar joins the pod");
        let sidecar = SidecarProcess { child };
        let filter: Vec<String> = ports.iter().map(|p| format!("sport = :{p}")).collect();
        let listening = wait_for(Duration::from_secs(10), || {
            let out = netns.exec("ss", &["-Hltn", &filter.join(" or ")]);
            (out.lines().count() == ports.len()).then_some(())
        });
        assert!(listening.is_some(), "the sidecar {program} does not listen on {ports:?}");
        sidecar
    }
}

impl Drop for SidecarProcess {
    fn drop(&mut self) {
        // SAFETY: signals the process group the proxy leads; not reaped yet, so not reused.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}
