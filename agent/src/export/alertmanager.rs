//! Direct push of incidents to Alertmanager's v2 API (`--alertmanager-url`, repeatable), for nodes
//! whose metrics pipeline is itself down. Firing incidents are POSTed when they start and again
//! every `RESEND_INTERVAL` (with an `endsAt` a few intervals ahead, so they expire if the agent
//! dies); a resolved one is POSTed with `endsAt` until each Alertmanager took it. Labels are the
//! Prometheus rules' (`deploy/prometheus/kstall-rules.yaml`), so Alertmanager dedupes the two.
//!
//! Its own task, fed by snapshots it may drop: it never blocks the event path or the evaluator.
//!
//! Over https with the system's CAs or `--alertmanager-ca-file`, and with a bearer token or basic
//! auth read from files on every push (rotated credentials are taken up), as Prometheus's
//! `http_config` does.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{metrics::Metrics, rfc3339, tls};
use crate::incidents::{
    Incident,
    evaluator::{Evaluation, Subscriber},
};

pub const RESEND_INTERVAL: Duration = Duration::from_secs(60);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// An alert as Alertmanager's `POST /api/v2/alerts` takes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PostableAlert {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    #[serde(rename = "startsAt")]
    pub starts_at: String,
    #[serde(rename = "endsAt")]
    pub ends_at: String,
}

/// `nfs-sidecar-redirect` -> `KstallNfsSidecarRedirect`: the Prometheus rule's alert name.
pub fn alert_name(signature: &str) -> String {
    let mut name = String::from("Kstall");
    for part in signature.split('-') {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            name.extend(first.to_uppercase());
            name.push_str(chars.as_str());
        }
    }
    name
}

/// The alert for `incident` at `now`. Empty label values are left out, as Prometheus does.
pub fn alert(incident: &Incident, now_unix_ns: u64) -> PostableAlert {
    let mut labels = BTreeMap::new();
    labels.insert("alertname".to_string(), alert_name(&incident.signature));
    for (k, v) in [
        ("signature", incident.signature.as_str()),
        ("severity", incident.severity.as_str()),
        ("node", &incident.node),
        ("namespace", &incident.namespace),
        ("pod", &incident.pod),
    ] {
        if !v.is_empty() {
            labels.insert(k.to_string(), v.to_string());
        }
    }
    let annotations = BTreeMap::from([
        ("summary".to_string(), incident.summary.clone()),
        (
            "description".to_string(),
            format!(
                "kstall incident {} (evidence and the way out: kstall API /api/v1/incidents)",
                incident.id
            ),
        ),
        ("runbook".to_string(), format!("docs/runbooks/{}.md", incident.signature)),
    ]);
    let ends = match incident.resolved_unix_ns {
        Some(resolved) => resolved,
        // Expires by itself if the agent stops resending.
        None => now_unix_ns + 4 * RESEND_INTERVAL.as_nanos() as u64,
    };
    PostableAlert {
        labels,
        annotations,
        starts_at: rfc3339(incident.first_seen_unix_ns),
        ends_at: rfc3339(ends),
    }
}

/// What the evaluator hands over each second.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub firing: Vec<Incident>,
    pub resolved: Vec<Incident>,
}

/// Snapshots waiting for the pusher; it only needs the latest.
const SNAPSHOTS: usize = 4;

/// The evaluator's side of the pusher: each evaluation's snapshot, skipped while the pusher is
/// still busy with earlier ones (the next carries the same).
pub struct Feed(mpsc::Sender<Snapshot>);

impl Subscriber for Feed {
    fn publish(&mut self, evaluation: &Evaluation) {
        let snapshot =
            Snapshot { firing: evaluation.firing.to_vec(), resolved: evaluation.resolved.to_vec() };
        let _ = self.0.try_send(snapshot);
    }
}

/// The pusher and the subscriber that feeds it.
pub fn pusher(
    settings: Settings,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> (impl Future<Output = ()>, Feed) {
    let (feed, snapshots) = mpsc::channel(SNAPSHOTS);
    (run(settings, snapshots, metrics, stop), Feed(feed))
}

/// One Alertmanager and what it still has to be told.
struct Target {
    url: String,
    endpoint: hyper::Uri,
    /// Resolved incidents it has not acknowledged yet.
    resolved: HashMap<String, Incident>,
    /// Firing incident ids it acknowledged in the last successful post.
    told: Vec<String>,
    last_ok: Option<Instant>,
    next_attempt: Instant,
    failures: u32,
}

/// `http[s]://host:port[/prefix]` -> its `/api/v2/alerts` endpoint.
pub fn endpoint(url: &str) -> Result<hyper::Uri, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(format!("{url:?} is not an http[s]://host[:port] URL"));
    }
    let base = url.trim_end_matches('/');
    format!("{base}/api/v2/alerts").parse().map_err(|e| format!("{url:?}: {e}"))
}

/// Where to push and how: the URLs, whom to trust for https, the credentials.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    pub urls: Vec<String>,
    /// CA certificates (PEM) that sign the Alertmanagers' certificates; the system's otherwise.
    pub ca_file: Option<PathBuf>,
    pub auth: Option<Auth>,
}

/// The `Authorization` a push carries, its secret read from a file on every push.
#[derive(Debug, Clone, PartialEq)]
pub enum Auth {
    Bearer { token_file: PathBuf },
    Basic { user: String, password_file: PathBuf },
}

impl Settings {
    /// Everything a push will need, checked now: the URLs, the CA file, the credential files.
    /// The error names the setting.
    fn check(&self) -> Result<(), (&'static str, String)> {
        for url in &self.urls {
            endpoint(url).map_err(|e| ("alertmanager_url", e))?;
        }
        if self.urls.iter().any(|u| u.starts_with("https://")) || self.ca_file.is_some() {
            tls::client_config(self.ca_file.as_deref(), None).map_err(|e| ("alertmanager_ca_file", e))?;
        }
        match &self.auth {
            None => {}
            Some(Auth::Bearer { token_file }) => {
                secret(token_file).map_err(|e| ("alertmanager_bearer_token_file", e))?;
            }
            Some(Auth::Basic { user, password_file }) => {
                if user.contains(':') {
                    return Err(("alertmanager_basic_auth_user", format!("{user:?} contains ':'")));
                }
                secret(password_file).map_err(|e| ("alertmanager_basic_auth_password_file", e))?;
            }
        }
        Ok(())
    }
}

/// The push's settings as users give them: one declaration each, at once the flag, the
/// `KSTALL_*` variable and the file's key (`config.rs` merges the layers).
#[derive(Debug, Default, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(default)]
// A group id of its own: clap names a flattened struct's group after the type.
#[group(id = "alertmanager_settings")]
pub struct Flags {
    /// Push incidents to this Alertmanager (http[s]://host:port), repeatable or comma-separated.
    #[arg(long, env = "KSTALL_ALERTMANAGER_URL", value_name = "URL", value_delimiter = ',')]
    pub alertmanager_url: Option<Vec<String>>,
    /// CA certificates (PEM) that sign https Alertmanagers' certificates [default: the system's].
    #[arg(long, env = "KSTALL_ALERTMANAGER_CA_FILE", value_name = "FILE")]
    pub alertmanager_ca_file: Option<PathBuf>,
    /// A file holding the bearer token pushes carry (read on every push).
    #[arg(long, env = "KSTALL_ALERTMANAGER_BEARER_TOKEN_FILE", value_name = "FILE")]
    pub alertmanager_bearer_token_file: Option<PathBuf>,
    /// The basic-auth user pushes carry, with --alertmanager-basic-auth-password-file.
    #[arg(long, env = "KSTALL_ALERTMANAGER_BASIC_AUTH_USER", value_name = "USER")]
    pub alertmanager_basic_auth_user: Option<String>,
    /// A file holding that user's password (read on every push).
    #[arg(long, env = "KSTALL_ALERTMANAGER_BASIC_AUTH_PASSWORD_FILE", value_name = "FILE")]
    pub alertmanager_basic_auth_password_file: Option<PathBuf>,
}

impl Flags {
    /// The settings, checked as a push will need them (the URLs, the CA, the credential files);
    /// a bad value names its key.
    pub fn settings(self) -> Result<Settings, crate::setting::Invalid> {
        let urls = self
            .alertmanager_url
            .unwrap_or_default()
            .into_iter()
            .map(|u| u.trim().to_string())
            .filter(|u| !u.is_empty())
            .collect();
        let auth = match (
            self.alertmanager_bearer_token_file,
            self.alertmanager_basic_auth_user,
            self.alertmanager_basic_auth_password_file,
        ) {
            (None, None, None) => None,
            (Some(token_file), None, None) => Some(Auth::Bearer { token_file }),
            (None, Some(user), Some(password_file)) => Some(Auth::Basic { user, password_file }),
            (Some(_), _, _) => {
                let why = "a bearer token and basic auth exclude each other";
                return Err(("alertmanager_bearer_token_file", why.into()));
            }
            (None, Some(_), None) => {
                let why = "the basic-auth user needs a password file";
                return Err(("alertmanager_basic_auth_password_file", why.into()));
            }
            (None, None, Some(_)) => {
                let why = "the password file needs a basic-auth user";
                return Err(("alertmanager_basic_auth_user", why.into()));
            }
        };
        let settings = Settings { urls, ca_file: self.alertmanager_ca_file, auth };
        settings.check()?;
        Ok(settings)
    }
}

/// A token or password file's bound: far above any real one (a service account token is ~1 KiB).
const SECRET_MAX_BYTES: u64 = 64 << 10;

/// A secret file's content without its trailing newline.
fn secret(path: &Path) -> Result<String, String> {
    let text = crate::named_file::read_text(path, SECRET_MAX_BYTES)?;
    let text = text.trim_end_matches(['\n', '\r']).to_string();
    if text.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(text)
}

/// The `Authorization` header value for `auth`, from its file as it is now.
fn authorization(auth: &Auth) -> Result<String, String> {
    use base64::Engine as _;
    Ok(match auth {
        Auth::Bearer { token_file } => format!("Bearer {}", secret(token_file)?),
        Auth::Basic { user, password_file } => {
            let pair = format!("{user}:{}", secret(password_file)?);
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
        }
    })
}

type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Pushes until `stop`; `snapshots` come from the incident evaluator.
pub async fn run(
    settings: Settings,
    mut snapshots: mpsc::Receiver<Snapshot>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    // Plain http needs no trust store (a container image may have none).
    let https = settings.urls.iter().any(|u| u.starts_with("https://"));
    let tls = match if https {
        tls::client_config(settings.ca_file.as_deref(), None)
    } else {
        Ok(tls::plain_http_only())
    } {
        Ok(tls) => tls,
        // Checked when the configuration was read; a trust store gone since is said once.
        Err(e) => {
            tracing::error!(error = %e, "cannot push alerts to Alertmanager: no TLS configuration");
            return;
        }
    };
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    let client: HttpsClient = Client::builder(TokioExecutor::new()).build(connector);
    let auth = settings.auth.clone();
    let mut targets: Vec<Target> = settings
        .urls
        .into_iter()
        .filter_map(|url| {
            let endpoint = endpoint(&url).ok()?;
            Some(Target {
                url,
                endpoint,
                resolved: HashMap::new(),
                told: vec![],
                last_ok: None,
                next_attempt: Instant::now(),
                failures: 0,
            })
        })
        .collect();
    loop {
        let snapshot = tokio::select! {
            _ = stop.cancelled() => return,
            s = snapshots.recv() => match s { Some(s) => s, None => return },
        };
        let firing = snapshot.firing;
        for t in &mut targets {
            for r in &snapshot.resolved {
                t.resolved.insert(r.id.clone(), r.clone());
            }
        }
        let now = Instant::now();
        let now_ns = crate::kernel::unix_now_ns();
        for t in &mut targets {
            let mut ids: Vec<String> = firing.iter().map(|i| i.id.clone()).collect();
            ids.sort();
            let changed = ids != t.told || !t.resolved.is_empty();
            let due = t.last_ok.is_none_or(|at| now.duration_since(at) >= RESEND_INTERVAL);
            if (!changed && !due)
                || now < t.next_attempt
                || (firing.is_empty() && t.resolved.is_empty() && t.told.is_empty())
            {
                continue;
            }
            let alerts: Vec<PostableAlert> =
                firing.iter().chain(t.resolved.values()).map(|i| alert(i, now_ns)).collect();
            let result = tokio::select! {
                _ = stop.cancelled() => return,
                r = post(&client, &t.endpoint, auth.as_ref(), &alerts) => r,
            };
            match result {
                Ok(()) => {
                    if t.failures > 0 {
                        tracing::info!(url = %t.url, "Alertmanager reachable again");
                    }
                    t.failures = 0;
                    t.last_ok = Some(now);
                    t.told = ids;
                    t.resolved.clear();
                    t.next_attempt = now;
                    metrics.alertmanager_post(&t.url, true);
                }
                Err(e) => {
                    if t.failures == 0 {
                        tracing::warn!(url = %t.url, error = %e, "cannot push alerts to Alertmanager; retrying");
                    }
                    t.failures += 1;
                    let backoff = Duration::from_secs(1 << t.failures.min(6)).min(MAX_BACKOFF);
                    t.next_attempt = now + backoff;
                    metrics.alertmanager_post(&t.url, false);
                }
            }
        }
    }
}

async fn post(
    client: &HttpsClient,
    endpoint: &hyper::Uri,
    auth: Option<&Auth>,
    alerts: &[PostableAlert],
) -> Result<(), String> {
    let body = serde_json::to_vec(alerts).map_err(|e| e.to_string())?;
    let mut request =
        hyper::Request::post(endpoint.clone()).header(hyper::header::CONTENT_TYPE, "application/json");
    if let Some(auth) = auth.cloned() {
        // A file read: off the async threads, whatever the file is on.
        let header =
            tokio::task::spawn_blocking(move || authorization(&auth)).await.map_err(|e| e.to_string())?;
        request = request.header(hyper::header::AUTHORIZATION, header?);
    }
    let request = request.body(Full::new(Bytes::from(body))).map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(REQUEST_TIMEOUT, client.request(request))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| format!("{e:?}"))?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body).trim()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::incidents::tests::incident;

    #[test]
    fn alerts_carry_the_rules_labels() {
        assert_eq!(alert_name("nfs-sidecar-redirect"), "KstallNfsSidecarRedirect");
        assert_eq!(alert_name("system-oom"), "KstallSystemOom");
        assert_eq!(alert_name("cpu-soft-lockup"), "KstallCpuSoftLockup");
        let a = alert(&incident(None), 1_796_000_020_000_000_000);
        assert_eq!(
            a.labels.keys().map(String::as_str).collect::<Vec<_>>(),
            ["alertname", "namespace", "node", "pod", "severity", "signature"]
        );
        assert_eq!(a.starts_at, "2026-11-30T00:53:20Z");
        assert_eq!(a.ends_at, "2026-11-30T00:57:40Z", "four resend intervals ahead");
        let mut node_level = incident(Some(1_796_000_030_000_000_000));
        node_level.namespace.clear();
        node_level.pod.clear();
        let r = alert(&node_level, 0);
        assert!(!r.labels.contains_key("pod"), "empty labels are left out, as Prometheus does");
        assert_eq!(r.ends_at, "2026-11-30T00:53:50Z");
    }

    #[test]
    fn urls() {
        assert_eq!(endpoint("http://am:9093").unwrap().to_string(), "http://am:9093/api/v2/alerts");
        assert_eq!(
            endpoint("http://am:9093/prefix/").unwrap().to_string(),
            "http://am:9093/prefix/api/v2/alerts"
        );
        assert_eq!(endpoint("https://am:9093").unwrap().to_string(), "https://am:9093/api/v2/alerts");
        assert!(endpoint("ftp://am:9093").is_err());
        assert!(endpoint("am:9093").is_err());
        assert!(endpoint("not a url").is_err());
    }

    type Seen = Arc<std::sync::Mutex<Vec<serde_json::Value>>>;

    /// A fake Alertmanager: records each POST's body, fails the first `fail` of them.
    async fn fake_alertmanager(fail: usize) -> (String, Seen) {
        let (url, posts, _) = fake_alertmanager_with_heads(fail).await;
        (url, posts)
    }

    /// As [`fake_alertmanager`], recording each successful POST's request head too.
    async fn fake_alertmanager_with_heads(fail: usize) -> (String, Seen, Arc<std::sync::Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let posts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (seen, seen_heads) = (posts.clone(), heads.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Read headers and the whole body (Content-Length).
                loop {
                    let read = stream.read(&mut chunk).await.unwrap_or(0);
                    if read == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..read]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0);
                        if body.len() >= len {
                            assert!(head.starts_with("POST /api/v2/alerts"), "{head}");
                            n += 1;
                            let status = if n <= fail { "503 Service Unavailable" } else { "200 OK" };
                            if n > fail {
                                seen.lock().unwrap().push(serde_json::from_str(body).unwrap());
                                seen_heads.lock().unwrap().push(head.to_string());
                            }
                            let _ = stream
                                .write_all(
                                    format!(
                                        "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                                    )
                                    .as_bytes(),
                                )
                                .await;
                            break;
                        }
                    }
                }
            }
        });
        (url, posts, heads)
    }

    #[tokio::test]
    async fn each_push_carries_the_credentials_read_from_their_files_then() {
        let (url, _, heads) = fake_alertmanager_with_heads(0).await;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "first-token\n").unwrap();
        let settings = Settings {
            urls: vec![url],
            ca_file: None,
            auth: Some(Auth::Bearer { token_file: token.clone() }),
        };
        settings.check().unwrap();
        let metrics = Arc::new(Metrics::new(Default::default(), Default::default()));
        let (tx, rx) = mpsc::channel(4);
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(settings, rx, metrics, stop.clone()));
        let pushed = |n: usize| {
            let heads = heads.clone();
            async move {
                while heads.lock().unwrap().len() < n {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                heads.lock().unwrap()[n - 1].to_ascii_lowercase()
            }
        };
        tx.send(Snapshot { firing: vec![incident(None)], resolved: vec![] }).await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(10), pushed(1)).await.unwrap();
        assert!(first.contains("authorization: bearer first-token\r\n"), "{first}");
        // Rotated: the next push reads the new one.
        std::fs::write(&token, "second-token").unwrap();
        tx.send(Snapshot { firing: vec![], resolved: vec![incident(Some(1))] }).await.unwrap();
        let second = tokio::time::timeout(Duration::from_secs(10), pushed(2)).await.unwrap();
        assert!(second.contains("authorization: bearer second-token\r\n"), "{second}");
        stop.cancel();
        task.await.unwrap();
    }

    #[test]
    fn credentials_and_trust_are_checked_before_anything_runs() {
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "pw\n").unwrap();
        let basic = Auth::Basic { user: "kstall".into(), password_file: password.clone() };
        assert_eq!(authorization(&basic).unwrap(), "Basic a3N0YWxsOnB3", "base64 of kstall:pw");
        let settings = |auth, ca_file| Settings { urls: vec!["https://am:9093".into()], ca_file, auth };
        assert!(settings(Some(basic.clone()), None).check().is_ok(), "the system's trust store");
        let cases = [
            (
                settings(Some(Auth::Bearer { token_file: "/nonexistent".into() }), None),
                "alertmanager_bearer_token_file",
            ),
            (
                settings(Some(Auth::Basic { user: "a:b".into(), password_file: password.clone() }), None),
                "alertmanager_basic_auth_user",
            ),
            (settings(None, Some(password.clone())), "alertmanager_ca_file"),
            (settings(None, Some("/nonexistent/ca.crt".into())), "alertmanager_ca_file"),
        ];
        for (settings, field) in cases {
            assert_eq!(settings.check().unwrap_err().0, field);
        }
        std::fs::write(&password, "").unwrap();
        assert!(authorization(&basic).unwrap_err().contains("is empty"));
        // Plain http (or no Alertmanager) never asks for a trust store: an image may have none.
        let plain = Settings { urls: vec!["http://am:9093".into()], ..Default::default() };
        assert!(plain.check().is_ok() && Settings::default().check().is_ok());
    }

    /// `kstall_alertmanager_posts_total{result}` for `url`.
    fn posts_counted(metrics: &Metrics, url: &str, result: &str) -> u64 {
        let series = format!(r#"kstall_alertmanager_posts_total{{result="{result}",url="{url}"}} "#);
        let text = metrics.render();
        text.lines().find_map(|l| l.strip_prefix(&series)?.parse().ok()).unwrap_or(0)
    }

    /// Where to send snapshots while waiting, and which.
    type Resend<'a> = (&'a mpsc::Sender<Snapshot>, fn() -> Snapshot);

    /// Until the pusher has counted `n` posts with `result`, sending `resend`'s snapshot
    /// meanwhile if given, as the evaluator does (a retry is only tried on a snapshot).
    async fn until_counted(
        metrics: &Metrics,
        url: &str,
        (result, n): (&str, u64),
        resend: Option<Resend<'_>>,
    ) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while posts_counted(metrics, url, result) < n {
            assert!(Instant::now() < deadline, "{n} {result} posts not counted: {}", metrics.render());
            if let Some((tx, snapshot)) = resend {
                tx.send(snapshot()).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn fires_then_resolves_with_a_retry_after_a_failure() {
        let (url, posts) = fake_alertmanager(1).await;
        let metrics = Arc::new(Metrics::new(Default::default(), Default::default()));
        let (tx, rx) = mpsc::channel(4);
        let stop = CancellationToken::new();
        let settings = Settings { urls: vec![url.clone()], ..Default::default() };
        let task = tokio::spawn(run(settings, rx, metrics.clone(), stop.clone()));
        let firing = || Snapshot { firing: vec![incident(None)], resolved: vec![] };
        // The first post fails (503); a snapshot after the 2 s backoff retries it.
        tx.send(firing()).await.unwrap();
        until_counted(&metrics, &url, ("error", 1), None).await;
        until_counted(&metrics, &url, ("ok", 1), Some((&tx, firing))).await;
        // The same incidents again: nothing to tell within the resend interval. Snapshots are
        // taken in order, so a resend would be a post before the resolve's.
        for _ in 0..3 {
            tx.send(firing()).await.unwrap();
        }
        let resolved = Snapshot { firing: vec![], resolved: vec![incident(Some(1_796_000_030_000_000_000))] };
        tx.send(resolved).await.unwrap();
        until_counted(&metrics, &url, ("ok", 2), None).await;
        {
            let posts = posts.lock().unwrap();
            assert_eq!(posts.len(), 2, "one success after the failure, then the resolve: {posts:?}");
            assert_eq!(posts[0][0]["labels"]["alertname"], "KstallNfsSidecarRedirect");
            assert_eq!(posts[1][0]["endsAt"], "2026-11-30T00:53:50Z");
        }
        // Nothing firing, nothing to resolve: quiet, as the next incident's post shows (an empty
        // post would have come first).
        tx.send(Snapshot { firing: vec![], resolved: vec![] }).await.unwrap();
        tx.send(firing()).await.unwrap();
        until_counted(&metrics, &url, ("ok", 3), None).await;
        {
            let posts = posts.lock().unwrap();
            assert_eq!(posts.len(), 3, "{posts:?}");
            assert_eq!(posts[2][0]["labels"]["alertname"], "KstallNfsSidecarRedirect", "{posts:?}");
            assert_ne!(posts[2][0]["endsAt"], posts[1][0]["endsAt"], "{posts:?}");
        }
        assert_eq!(posts_counted(&metrics, &url, "error"), 1);
        stop.cancel();
        task.await.unwrap();
    }
}
