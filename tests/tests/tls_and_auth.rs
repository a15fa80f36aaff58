//! TLS and auth where the ecosystem has them. `/metrics` behind the exporter toolkit's web
//! configuration file: a real Prometheus (Debian's) scrapes a real agent over TLS with basic auth;
//! a scrape without credentials is refused; curl checks each refusal; a client CA added to the
//! file while the agent runs is enforced once the file is read again; a head over the limit gets
//! 431. And the agent's push to a real Alertmanager behind TLS and basic auth.

use std::{
    path::Path,
    process::{Command, Output},
    time::Duration,
};

use kstall_tests::{
    agent::Agent,
    alerting::{Service, alertmanager_behind, prometheus_with_config},
    host::wait_for,
    kernel_tests_can_run,
    netns::{NetNs, NfsReconnects},
    tls::make_certificates,
};

const USER: &str = "prometheus";
const PASSWORD: &str = "s3cret-scrape";

fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "10"])
        .args(args)
        .output()
        .expect("run curl")
}

/// The HTTP status curl got, or why it got none.
fn status(args: &[&str]) -> Result<u16, String> {
    let out = curl(&[&["--output", "/dev/null", "--write-out", "%{http_code}"], args].concat());
    let code: u16 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
    match (out.status.success(), code) {
        (true, code) if code > 0 => Ok(code),
        _ => {
            Err(format!("curl exit {:?}: {}", out.status.code(), String::from_utf8_lossy(&out.stderr).trim()))
        }
    }
}

fn web_config(dir: &Path, client_ca: bool) {
    let hash = bcrypt::hash(PASSWORD, 6).unwrap();
    let client = if client_ca {
        "\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt"
    } else {
        ""
    };
    // Relative paths: relative to the file, as in node_exporter.
    let text = format!(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key{client}\n\
         basic_auth_users:\n  {USER}: {hash}\n\
         http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=31536000\n"
    );
    // Written whole and renamed: the agent never reads half a file.
    std::fs::write(dir.join("web.yml.new"), text).unwrap();
    std::fs::rename(dir.join("web.yml.new"), dir.join("web.yml")).unwrap();
}

/// Prometheus scraping `target` twice: with the CA, credentials (and a client certificate when
/// asked), as job `kstall`; with the CA alone, as job `no-credentials`.
fn prometheus(dir: &Path, target: &str) -> Service {
    let d = dir.display();
    prometheus_with_config(format!(
        "global: {{scrape_interval: 1s}}\n\
         scrape_configs:\n\
         - job_name: kstall\n  scheme: https\n  \
           tls_config: {{ca_file: {d}/ca.crt, cert_file: {d}/client.crt, key_file: {d}/client.key}}\n  \
           basic_auth: {{username: {USER}, password: {PASSWORD}}}\n  \
           static_configs: [{{targets: ['{target}']}}]\n\
         - job_name: no-credentials\n  scheme: https\n  tls_config: {{ca_file: {d}/ca.crt}}\n  \
           static_configs: [{{targets: ['{target}']}}]\n"
    ))
}

/// `up` of `job` as Prometheus last scraped it.
fn up(prometheus: &Service, job: &str) -> Option<f64> {
    let answer = prometheus.get_json(&format!("/api/v1/query?query=up%7Bjob%3D%22{job}%22%7D"));
    answer["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

#[test]
fn a_real_prometheus_scrapes_over_tls_with_basic_auth_and_no_credentials_are_refused() {
    if !kernel_tests_can_run(
        "a_real_prometheus_scrapes_over_tls_with_basic_auth_and_no_credentials_are_refused",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_certificates(d);
    web_config(d, false);
    let web_file = d.join("web.yml");
    let agent = Agent::start(&["--web-config-file", web_file.to_str().unwrap()]);
    let url = |path: &str| format!("https://{}{path}", agent.listen);
    let ca = d.join("ca.crt");
    let ca = ca.to_str().unwrap();
    let credentials = format!("{USER}:{PASSWORD}");

    assert_eq!(status(&["--cacert", ca, &url("/metrics")]), Ok(401), "no credentials");
    assert_eq!(status(&["--cacert", ca, "--user", &format!("{USER}:wrong"), &url("/metrics")]), Ok(401));
    assert_eq!(status(&["--cacert", ca, "--user", &format!("nobody:{PASSWORD}"), &url("/metrics")]), Ok(401));
    let scraped = curl(&["--cacert", ca, "--user", &credentials, "--include", &url("/metrics")]);
    let scraped = String::from_utf8_lossy(&scraped.stdout);
    assert!(scraped.starts_with("HTTP/1.1 200"), "{}", &scraped[..scraped.len().min(300)]);
    assert!(scraped.contains("kstall_build_info"), "the exposition");
    assert!(scraped.contains("strict-transport-security: max-age=31536000"), "the configured header");
    assert_eq!(status(&["--cacert", ca, &url("/healthz")]), Ok(200), "the readiness probe needs none");
    let plain = status(&[&format!("http://{}/metrics", agent.listen)]);
    assert!(!matches!(plain, Ok(200)), "plain HTTP to the TLS port: {plain:?}");
    // A request head past the limit is refused as such, not read on.
    let big = format!("X-Padding: {}", "p".repeat(20 * 1024));
    assert_eq!(status(&["--cacert", ca, "--user", &credentials, "-H", &big, &url("/metrics")]), Ok(431));

    // A real Prometheus: scraped with credentials, refused without.
    let prometheus = prometheus(d, &agent.listen.to_string());
    let scraping =
        wait_for(Duration::from_secs(30), || (up(&prometheus, "kstall") == Some(1.0)).then_some(()));
    assert!(
        scraping.is_some(),
        "Prometheus does not scrape kstall: up={:?}\n{}",
        up(&prometheus, "kstall"),
        prometheus.log()
    );
    let refused =
        wait_for(Duration::from_secs(30), || (up(&prometheus, "no-credentials") == Some(0.0)).then_some(()));
    assert!(refused.is_some(), "a scrape without credentials: up={:?}", up(&prometheus, "no-credentials"));

    // The file now asks for client certificates: read again while the agent runs.
    web_config(d, true);
    let enforced = wait_for(Duration::from_secs(30), || {
        status(&["--cacert", ca, "--user", &credentials, &url("/metrics")]).is_err().then_some(())
    });
    assert!(enforced.is_some(), "a client without a certificate is still served:\n{}", agent.log());
    let client =
        ["--cert", &format!("{}/client.crt", d.display()), "--key", &format!("{}/client.key", d.display())];
    assert_eq!(
        status(&[&client[..], &["--cacert", ca, "--user", &credentials, &url("/metrics")]].concat()),
        Ok(200)
    );
    // Its reader may be behind the agent.
    let reread = agent.log_once_it_has("web configuration read again", Duration::from_secs(10));
    assert!(reread.is_some(), "{}", agent.log());
    // Prometheus has the client certificate: its scrapes since go on.
    let enforced_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let query = format!(
        "/api/v1/query?query=up%7Bjob%3D%22kstall%22%7D%20and%20timestamp(up%7Bjob%3D%22kstall%22%7D)%20%3E%20{enforced_at}"
    );
    let since = wait_for(Duration::from_secs(30), || {
        let answer = prometheus.get_json(&query);
        answer["data"]["result"][0]["value"][1].as_str().map(str::to_string)
    });
    assert_eq!(since.as_deref(), Some("1"), "scrapes with the client certificate:\n{}", prometheus.log());
}

#[test]
fn a_bad_web_config_file_exits_64_naming_it() {
    if !kernel_tests_can_run("a_bad_web_config_file_exits_64_naming_it") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yml");
    std::fs::write(&file, "basic_auth_users:\n  prometheus: not-a-hash\n").unwrap();
    let out = Command::new(kstall_tests::agent::agent_binary())
        .args(["agent", "--web-config-file", file.to_str().unwrap(), "--state-dir", "none"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--web-config-file: ") && stderr.contains("not a bcrypt hash"), "{stderr}");
}

#[test]
fn incidents_are_pushed_to_an_alertmanager_over_https_with_basic_auth() {
    if !kernel_tests_can_run("incidents_are_pushed_to_an_alertmanager_over_https_with_basic_auth") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_certificates(d);
    let hash = bcrypt::hash("am-password", 6).unwrap();
    let web = d.join("alertmanager-web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config: {{cert_file: {0}/server.crt, key_file: {0}/server.key}}\n\
             basic_auth_users: {{kstall: {hash}}}\n",
            d.display()
        ),
    )
    .unwrap();
    let ca = d.join("ca.crt").to_str().unwrap().to_string();
    let curl_auth = vec!["--cacert".to_string(), ca.clone(), "--user".into(), "kstall:am-password".into()];
    let alertmanager = alertmanager_behind(&web, curl_auth.clone());
    let am_url = format!("https://{}", alertmanager.addr);
    // Without the credentials, Alertmanager refuses: the push must carry them.
    let refused = status(&["--cacert", &ca, &format!("{am_url}/api/v2/alerts")]);
    assert_eq!(refused, Ok(401), "the Alertmanager under test asks for credentials");
    let password = d.join("password");
    std::fs::write(&password, "am-password\n").unwrap();
    let agent = Agent::start(&[
        "--alertmanager-url",
        &am_url,
        "--alertmanager-ca-file",
        &ca,
        "--alertmanager-basic-auth-user",
        "kstall",
        "--alertmanager-basic-auth-password-file",
        password.to_str().unwrap(),
    ]);
    // Incident 1 for real: SYNs to 2049 redirected by the sidecar's rule and reset.
    let ns = NetNs::new("am-tls");
    ns.redirect_tcp("iptables", 2049, 15001);
    let mut client = NfsReconnects::start(&ns);
    let pushed = wait_for(Duration::from_secs(30), || {
        let out = curl(
            &[
                &curl_auth.iter().map(String::as_str).collect::<Vec<_>>()[..],
                &[&format!("{am_url}/api/v2/alerts")],
            ]
            .concat(),
        );
        let alerts: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        alerts.as_array()?.iter().find(|a| a["labels"]["alertname"] == "KstallNfsSidecarRedirect").cloned()
    });
    let pushed = pushed
        .unwrap_or_else(|| panic!("no alert in Alertmanager:\n{}\n{}", agent.log(), alertmanager.log()));
    client.stop();
    assert_eq!(pushed["labels"]["signature"], "nfs-sidecar-redirect", "{pushed}");
    let ok = agent.metric(&format!(r#"kstall_alertmanager_posts_total{{result="ok",url="{am_url}"}}"#));
    assert!(ok.is_some_and(|n| n >= 1.0), "{}", agent.metrics());
    let failed =
        agent.metric(&format!(r#"kstall_alertmanager_posts_total{{result="error",url="{am_url}"}}"#));
    assert_eq!(failed, None, "no push failed:\n{}", agent.log());
}
