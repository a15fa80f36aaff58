//! A real Prometheus and a real Alertmanager (Debian's packages), each started by the test on a
//! free local port with its data in a temporary directory, and stopped (with the directory
//! removed) on drop.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

/// A service process, killed on drop; its output is kept for failure messages.
pub struct Service {
    child: Child,
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Service {
    fn start(program: &str, args: impl FnOnce(&Path, SocketAddr) -> Vec<String>, ready_path: &str) -> Self {
        Self::start_ready_when(program, args, |addr| http_get(addr, ready_path).is_some())
    }

    /// As [`Service::start`], ready once `ready` says so (a TLS service needs its own check).
    fn start_ready_when(
        program: &str,
        args: impl FnOnce(&Path, SocketAddr) -> Vec<String>,
        ready: impl Fn(SocketAddr) -> bool,
    ) -> Self {
        let dir = tempfile::tempdir().expect("service dir");
        let addr = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port");
        let log = std::fs::File::create(dir.path().join("log")).expect("log file");
        let child = Command::new(program)
            .args(args(dir.path(), addr))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {program} (Debian package installed by the bootstrap): {e}"));
        let mut service = Service { child, addr, dir };
        let deadline = Instant::now() + crate::START_WITHIN;
        while !ready(addr) {
            if let Ok(Some(status)) = service.child.try_wait() {
                panic!("{program} exited ({status}) before it was ready:\n{}", service.log());
            }
            let waited = crate::START_WITHIN.as_secs();
            assert!(Instant::now() < deadline, "{program} not ready after {waited} s:\n{}", service.log());
            std::thread::sleep(Duration::from_millis(200));
        }
        service
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// GET `path`, parsed as JSON.
    pub fn get_json(&self, path: &str) -> Value {
        let body = http_get(self.addr, path).unwrap_or_else(|| panic!("GET {path}:\n{}", self.log()));
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An Alertmanager that routes everything to a receiver that sends nothing: the test reads its
/// API. Clustering is off.
pub fn alertmanager() -> Service {
    Service::start(
        "prometheus-alertmanager",
        |dir, addr| {
            let config = dir.join("alertmanager.yml");
            std::fs::write(
                &config,
                "route: {receiver: 'null', group_wait: 1s, group_interval: 1s, repeat_interval: 1h}\n\
                 receivers: [{name: 'null'}]\n",
            )
            .expect("alertmanager config");
            vec![
                format!("--config.file={}", config.display()),
                format!("--storage.path={}", dir.join("data").display()),
                format!("--web.listen-address={addr}"),
                "--cluster.listen-address=".into(),
            ]
        },
        "/-/ready",
    )
}

/// An Alertmanager running `config` (its alertmanager.yml, as shipped), clustering off.
pub fn alertmanager_with_config(config: &Path) -> Service {
    let config = config.canonicalize().expect("alertmanager config");
    Service::start(
        "prometheus-alertmanager",
        move |dir, addr| {
            vec![
                format!("--config.file={}", config.display()),
                format!("--storage.path={}", dir.join("data").display()),
                format!("--web.listen-address={addr}"),
                "--cluster.listen-address=".into(),
            ]
        },
        "/-/ready",
    )
}

/// As [`alertmanager`], behind the exporter toolkit's `web_config` (TLS, basic auth), as
/// `--web.config.file`; ready once `curl_ready` (curl's arguments for its CA and credentials)
/// gets `/-/ready`.
pub fn alertmanager_behind(web_config: &Path, curl_ready: Vec<String>) -> Service {
    let web_config = web_config.to_path_buf();
    Service::start_ready_when(
        "prometheus-alertmanager",
        move |dir, addr| {
            let config = dir.join("alertmanager.yml");
            std::fs::write(&config, "route: {receiver: 'null'}\nreceivers: [{name: 'null'}]\n")
                .expect("alertmanager config");
            vec![
                format!("--config.file={}", config.display()),
                format!("--storage.path={}", dir.join("data").display()),
                format!("--web.listen-address={addr}"),
                format!("--web.config.file={}", web_config.display()),
                "--cluster.listen-address=".into(),
            ]
        },
        move |addr| {
            Command::new("curl")
                .args(["--silent", "--fail", "--max-time", "2"])
                .args(&curl_ready)
                .arg(format!("https://{addr}/-/ready"))
                .output()
                .is_ok_and(|o| o.status.success())
        },
    )
}

/// A Prometheus scraping `target` every second as job `kstall`, evaluating `rules` every second
/// and sending alerts to `alertmanager`.
pub fn prometheus(target: SocketAddr, rules: &Path, alertmanager: SocketAddr) -> Service {
    let rules = rules.canonicalize().expect("rules file");
    prometheus_with_config(format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
         rule_files: ['{}']\n\
         alerting: {{alertmanagers: [{{static_configs: [{{targets: ['{alertmanager}']}}]}}]}}\n\
         scrape_configs: [{{job_name: kstall, static_configs: [{{targets: ['{target}']}}]}}]\n",
        rules.display()
    ))
}

/// A Prometheus running `config` (its prometheus.yml).
pub fn prometheus_with_config(config: String) -> Service {
    Service::start(
        "prometheus",
        move |dir, addr| {
            let path = dir.join("prometheus.yml");
            std::fs::write(&path, config).expect("prometheus config");
            vec![
                format!("--config.file={}", path.display()),
                format!("--storage.tsdb.path={}", dir.join("data").display()),
                format!("--web.listen-address={addr}"),
            ]
        },
        "/-/ready",
    )
}

/// Body of a successful HTTP GET, `None` when the server is not there or answers an error.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.split_whitespace().nth(1).filter(|code| code.starts_with('2'))?;
    Some(body.to_string())
}

/// `promtool check metrics` of an exposition: its complaints (lint and format), empty when clean.
pub fn promtool_complaints(exposition: &str) -> String {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    promtool.stdin.take().expect("stdin").write_all(exposition.as_bytes()).expect("write to promtool");
    let checked = promtool.wait_with_output().expect("promtool");
    let complaints =
        format!("{}{}", String::from_utf8_lossy(&checked.stdout), String::from_utf8_lossy(&checked.stderr));
    match (checked.status.success(), complaints.trim()) {
        (true, "") => String::new(),
        (ok, text) => format!("promtool check metrics (exit ok: {ok}):\n{text}"),
    }
}
