//! Two cheap checks of the node's kubelet, which `kubelet-degraded` reads (incident 4: a kubelet
//! that still sent Ready heartbeats but terminated no pod, and whose `:10250` timed out in TLS
//! handshakes): a GET of its `healthz` endpoint, and a TLS handshake with its server. Each has a
//! short timeout, runs on its own task, and is published on a `watch` channel: the evaluator
//! reads the last result and never waits on a kubelet.
//!
//! The server is checked where Kubernetes says the node is (`--node-ip`, the pod's
//! `status.hostIP`), not on 127.0.0.1: a hardened kubelet serves on its node address only. A
//! check that has never passed since start is a wrong address, not a degraded kubelet: it is one
//! warning naming the address tried, the node's and the flag, and no incident — degraded means it
//! worked, then stopped.

use std::{sync::Arc, time::Duration};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
    pki_types::{CertificateDer, ServerName, UnixTime},
};
use serde::{Deserialize, Serialize};
use tokio::{net::TcpStream, sync::watch};
use tokio_util::sync::CancellationToken;

use crate::{attribution::pods::api::ErrorChain, kernel};

#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `http://127.0.0.1:10248/healthz`: the kubelet's own health endpoint (plain HTTP on
    /// localhost; the agent runs in the node's network namespace).
    pub healthz: hyper::Uri,
    /// The kubelet's server, where `kubectl logs` and `exec` go: `--kubelet-server`, else
    /// `<node IP>:10250`, else `127.0.0.1:10250`.
    pub server: String,
    /// The node's address as Kubernetes advertises it (`--node-ip`), for the warning.
    pub advertised: Option<std::net::IpAddr>,
    pub interval: Duration,
    /// How long each check may take; the kubelet answers both in milliseconds when well.
    pub timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            healthz: DEFAULT_HEALTHZ.parse().expect("a URL"),
            server: DEFAULT_SERVER.into(),
            advertised: None,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(3),
        }
    }
}

/// The checks' settings as users give them: one declaration each, at once the flag, the
/// `KSTALL_*` variable and the file's key (`config.rs` merges the layers).
#[derive(Debug, Default, clap::Args, Serialize, Deserialize)]
#[serde(default)]
// A group id of its own: clap names a flattened struct's group after the type.
#[group(id = "kubelet_settings")]
pub struct Flags {
    /// Check the kubelet's healthz and TLS handshake for kubelet-degraded: on or off [default: on
    /// with the Kubernetes API pod source, else off].
    #[arg(long, env = "KSTALL_KUBELET_CHECKS", value_name = "on|off")]
    pub kubelet_checks: Option<String>,
    /// [default: http://127.0.0.1:10248/healthz].
    #[arg(long, env = "KSTALL_KUBELET_HEALTHZ", value_name = "URL")]
    pub kubelet_healthz: Option<String>,
    /// The kubelet's server, for the TLS handshake check [default: --node-ip:10250, else
    /// 127.0.0.1:10250].
    #[arg(long, env = "KSTALL_KUBELET_SERVER", value_name = "HOST:PORT")]
    pub kubelet_server: Option<String>,
    /// This node's address as Kubernetes advertises it (the DaemonSet passes the pod's
    /// status.hostIP): where the kubelet serves unless --kubelet-server says otherwise (kubelets
    /// of hardened nodes serve on it, not on 127.0.0.1).
    #[arg(long, env = "KSTALL_NODE_IP", value_name = "IP")]
    pub node_ip: Option<String>,
}

impl Flags {
    /// The checks, or none when they are off; on by default with the Kubernetes API pod source
    /// (`api`). A bad value names its key.
    pub fn settings(self, api: bool) -> Result<Option<Settings>, crate::setting::Invalid> {
        if !crate::setting::on_off("kubelet_checks", self.kubelet_checks)?.unwrap_or(api) {
            return Ok(None);
        }
        let mut settings = Settings::default();
        if let Some(url) = self.kubelet_healthz {
            settings.healthz = healthz_url(url.trim()).map_err(|e| ("kubelet_healthz", e))?;
        }
        if let Some(ip) = self.node_ip {
            let ip = ip
                .trim()
                .parse::<std::net::IpAddr>()
                .map_err(|_| ("node_ip", format!("{ip:?} is not an IP address")))?;
            settings.advertised = Some(ip);
            settings.server = std::net::SocketAddr::new(ip, DEFAULT_PORT).to_string();
        }
        if let Some(address) = self.kubelet_server {
            settings.server = server_address(address.trim()).map_err(|e| ("kubelet_server", e))?;
        }
        Ok(Some(settings))
    }
}

pub const DEFAULT_HEALTHZ: &str = "http://127.0.0.1:10248/healthz";
pub const DEFAULT_SERVER: &str = "127.0.0.1:10250";
/// The kubelet's port unless its configuration says otherwise.
pub const DEFAULT_PORT: u16 = 10250;
/// Failures in a row of a check that never passed before the warning: a kubelet still starting
/// is not yet a wrong address.
const NEVER_PASSED_WARNING_AFTER: u32 = 3;

/// `--kubelet-healthz`: an http:// URL with a host.
pub fn healthz_url(url: &str) -> Result<hyper::Uri, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(format!("{url:?} is not an http://host[:port]/path URL"));
    }
    Ok(uri)
}

/// `--kubelet-server`: `host:port`.
pub fn server_address(address: &str) -> Result<String, String> {
    match address.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {
            Ok(address.to_string())
        }
        _ => Err(format!("{address:?} is not host:port")),
    }
}

/// The last result of each check; `None` before the first, or when the checks are off.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub healthz: Option<Check>,
    pub tls: Option<Check>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// What was checked: the URL, or the server's address.
    pub target: String,
    /// Why the last check failed; `None` when it passed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The first of the failures in a row, while it fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failing_since_unix_ns: Option<u64>,
    pub checked_unix_ns: u64,
    /// Whether it has passed since the agent started: only then can it be degraded.
    pub passed_once: bool,
    /// Failures in a row.
    #[serde(skip)]
    pub(crate) failures: u32,
}

impl Check {
    /// The check after `outcome`, carrying when the failures started.
    fn after(previous: Option<&Check>, target: String, outcome: Result<(), String>, now: u64) -> Check {
        let failing_since = match &outcome {
            Ok(()) => None,
            Err(_) => Some(previous.and_then(|p| p.failing_since_unix_ns).unwrap_or(now)),
        };
        let passed_once = previous.is_some_and(|p| p.passed_once) || outcome.is_ok();
        let failures = match outcome {
            Ok(()) => 0,
            Err(_) => previous.map_or(0, |p| p.failures) + 1,
        };
        Check {
            target,
            error: outcome.err(),
            failing_since_unix_ns: failing_since,
            checked_unix_ns: now,
            passed_once,
            failures,
        }
    }

    /// Whether this is the moment to say the check never worked (once, after a few tries).
    fn never_worked(&self) -> bool {
        !self.passed_once && self.failures == NEVER_PASSED_WARNING_AFTER
    }
}

/// The one warning for a check that has not passed since start.
fn warn_never_worked(what: &str, check: &Check, flag: &str, advertised: Option<std::net::IpAddr>) {
    let advertised = advertised.map_or_else(
        || "unknown (no --node-ip: the DaemonSet passes status.hostIP)".to_string(),
        |ip| ip.to_string(),
    );
    tracing::warn!(
        check = what,
        tried = %check.target,
        error = check.error.as_deref().unwrap_or_default(),
        node_address = %advertised,
        "the kubelet check has not passed since start: a wrong address, not a degraded kubelet (no incident until it has worked once); set {flag} to where this node's kubelet serves"
    );
}

/// Checks the kubelet every `interval` until `stop`.
pub async fn watch(settings: Settings, health: watch::Sender<Health>, stop: CancellationToken) {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let tls = tls_client();
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let checks = async {
            tokio::join!(
                healthz(&client, &settings.healthz, settings.timeout),
                handshake(&tls, &settings.server, settings.timeout),
            )
        };
        let (healthz, handshake) = tokio::select! {
            _ = stop.cancelled() => return,
            outcomes = checks => outcomes,
        };
        let now = kernel::unix_now_ns();
        health.send_modify(|h| {
            h.healthz = Some(Check::after(h.healthz.as_ref(), settings.healthz.to_string(), healthz, now));
            h.tls = Some(Check::after(h.tls.as_ref(), settings.server.clone(), handshake, now));
        });
        let h = health.borrow().clone();
        for (what, check, flag) in
            [("healthz", &h.healthz, "--kubelet-healthz"), ("tls", &h.tls, "--kubelet-server")]
        {
            if let Some(check) = check.as_ref().filter(|c| c.never_worked()) {
                warn_never_worked(what, check, flag, settings.advertised);
            }
        }
    }
}

async fn healthz(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    url: &hyper::Uri,
    timeout: Duration,
) -> Result<(), String> {
    let answer = async {
        let response = client.get(url.clone()).await.map_err(|e| ErrorChain(&e).to_string())?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        if status.is_success() {
            return Ok(());
        }
        let body = String::from_utf8_lossy(&body[..body.len().min(200)]).trim().to_string();
        Err(format!("HTTP {}: {body}", status.as_u16()))
    };
    tokio::time::timeout(timeout, answer)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {}", human(timeout))))
}

/// A TLS handshake with `address`, nothing sent after it: the kubelet's certificate is often
/// self-signed, and whether it is trusted is not the question — whether the server finishes a
/// handshake is.
async fn handshake(tls: &tokio_rustls::TlsConnector, address: &str, timeout: Duration) -> Result<(), String> {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_string()).map_err(|e| format!("{host:?}: {e}"))?;
    let connect = async {
        let tcp = TcpStream::connect(address).await.map_err(|e| format!("connect: {e}"))?;
        Ok::<_, String>(tcp)
    };
    let tcp = match tokio::time::timeout(timeout, connect).await {
        Ok(tcp) => tcp?,
        Err(_) => return Err(format!("no TCP connection within {}", human(timeout))),
    };
    match tokio::time::timeout(timeout, tls.connect(name, tcp)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("TLS handshake failed: {e}")),
        Err(_) => Err(format!("TLS handshake not finished within {}", human(timeout))),
    }
}

fn human(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn tls_client() -> tokio_rustls::TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Takes any certificate, checks the handshake's signatures as usual.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests;
