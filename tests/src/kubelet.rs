//! A stand-in for the node's kubelet as kstall checks it (`kubelet.py`): its healthz and its TLS
//! server on loopback (free ports, or the kubelet's own), switched between wedged and well by the
//! test. Stopped on drop.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::host::wait_for;

pub struct FakeKubelet {
    child: Child,
    dir: tempfile::TempDir,
    pub healthz_port: u16,
    pub tls_port: u16,
}

impl FakeKubelet {
    /// Well, on free ports, presenting `cert` and `key`: kstall's checks pass, and only a check
    /// that passed can be degraded later ([`FakeKubelet::wedge`]).
    pub fn start_well(cert: &Path, key: &Path) -> Self {
        Self::start(cert, key, "well", None)
    }

    /// Well, on the kubelet's ports (10248, 10250): where the DaemonSet's defaults look.
    pub fn start_well_on_the_kubelets_ports(cert: &Path, key: &Path) -> Self {
        Self::start(cert, key, "well", Some((10248, 10250)))
    }

    fn start(cert: &Path, key: &Path, state_now: &str, ports_wanted: Option<(u16, u16)>) -> Self {
        let dir = tempfile::tempdir().expect("kubelet dir");
        let (script, state, ports) =
            (dir.path().join("kubelet.py"), dir.path().join("state"), dir.path().join("ports"));
        std::fs::write(&script, include_str!("kubelet.py")).unwrap();
        std::fs::write(&state, state_now).unwrap();
        let wanted: Vec<String> =
            ports_wanted.iter().flat_map(|(h, t)| [h.to_string(), t.to_string()]).collect();
        let child = Command::new("python3")
            .arg(&script)
            .args([cert, key, &state, &ports])
            .args(&wanted)
            .stdout(Stdio::null())
            .spawn()
            .expect("start the fake kubelet");
        let (healthz_port, tls_port) = wait_for(Duration::from_secs(10), || {
            let text = std::fs::read_to_string(&ports).ok()?;
            let (h, t) = text.split_once(' ')?;
            Some((h.parse().ok()?, t.parse().ok()?))
        })
        .expect("the fake kubelet did not start");
        FakeKubelet { child, dir, healthz_port, tls_port }
    }

    /// Hangs healthz and never finishes a handshake from now on, as incident 4's kubelet.
    pub fn wedge(&self) {
        std::fs::write(self.dir.path().join("state"), "wedged").unwrap();
    }

    /// Answers healthz and finishes handshakes from now on.
    pub fn recover(&self) {
        std::fs::write(self.dir.path().join("state"), "well").unwrap();
    }

    pub fn healthz_url(&self) -> String {
        format!("http://127.0.0.1:{}/healthz", self.healthz_port)
    }

    pub fn server(&self) -> String {
        format!("127.0.0.1:{}", self.tls_port)
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
