//! The checks against stand-in kubelets on loopback: a healthz that hangs, a server that takes
//! the connection and never finishes the TLS handshake, and a well one (a certificate made for
//! the test by `openssl`, as a kubelet's self-signed one).

use std::{net::SocketAddr, process::Command};

use rustls::pki_types::{PrivateKeyDer, pem::PemObject};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use super::*;

const TIMEOUT: Duration = Duration::from_millis(300);

/// Accepts connections and reads them, answering nothing: a hanging healthz, and a `:10250`
/// whose handshake never finishes (it takes the ClientHello and sends no ServerHello).
async fn silent() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = [0; 1024];
            let _ = socket.read(&mut buf).await;
            held.push(socket);
        }
    });
    (addr, task)
}

/// A healthz answering `status` with `body`.
async fn answering(status: &'static str, body: &'static str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = [0; 1024];
            let _ = socket.read(&mut buf).await;
            let answer = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}", body.len());
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    });
    (addr, task)
}

/// A TLS server with a self-signed certificate, finishing every handshake.
async fn tls_server() -> (SocketAddr, tokio::task::JoinHandle<()>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
        .args(["-days", "1", "-subj", "/CN=node-a"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let certs = vec![CertificateDer::from_pem_file(&cert).unwrap()];
    let key = PrivateKeyDer::from_pem_file(&key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(socket).await {
                    let mut buf = [0; 16];
                    let _ = tls.read(&mut buf).await;
                }
            });
        }
    });
    (addr, task, dir)
}

fn http(addr: SocketAddr) -> hyper::Uri {
    healthz_url(&format!("http://{addr}/healthz")).unwrap()
}

fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

#[tokio::test]
async fn a_hanging_healthz_times_out_and_a_well_one_passes() {
    let (hanging, _h) = silent().await;
    let error = healthz(&client(), &http(hanging), TIMEOUT).await.unwrap_err();
    assert_eq!(error, "no answer within 0.3 s");
    let (well, _w) = answering("200 OK", "ok").await;
    healthz(&client(), &http(well), TIMEOUT).await.unwrap();
    let (failing, _f) = answering("500 Internal Server Error", "[-]syncloop failed: reason withheld").await;
    let error = healthz(&client(), &http(failing), TIMEOUT).await.unwrap_err();
    assert_eq!(error, "HTTP 500: [-]syncloop failed: reason withheld");
}

#[tokio::test]
async fn a_server_that_never_finishes_the_handshake_times_out_and_a_well_one_passes() {
    let tls = tls_client();
    let (stuck, _s) = silent().await;
    let error = handshake(&tls, &stuck.to_string(), TIMEOUT).await.unwrap_err();
    assert_eq!(error, "TLS handshake not finished within 0.3 s");
    let (well, _w, _dir) = tls_server().await;
    handshake(&tls, &well.to_string(), TIMEOUT).await.unwrap();
    // Nothing listening: refused at once, not a timeout.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let error = handshake(&tls, &closed.to_string(), TIMEOUT).await.unwrap_err();
    assert!(error.starts_with("connect: Connection refused"), "{error}");
}

#[tokio::test]
async fn failures_in_a_row_keep_when_they_started() {
    let (hanging, _h) = silent().await;
    let (stuck, _s) = silent().await;
    let settings = Settings {
        healthz: http(hanging),
        server: stuck.to_string(),
        advertised: None,
        interval: Duration::from_millis(50),
        timeout: Duration::from_millis(100),
    };
    let (tx, mut rx) = watch::channel(Health::default());
    let stop = CancellationToken::new();
    let task = tokio::spawn(watch(settings, tx, stop.clone()));
    let mut seen = Vec::new();
    while seen.len() < 3 {
        rx.changed().await.unwrap();
        seen.push(rx.borrow_and_update().clone());
    }
    let since: Vec<Option<u64>> =
        seen.iter().map(|h| h.healthz.as_ref().unwrap().failing_since_unix_ns).collect();
    assert!(since[0].is_some() && since.iter().all(|s| *s == since[0]), "{seen:?}");
    let last = &seen[2];
    assert!(last.healthz.as_ref().unwrap().checked_unix_ns > since[0].unwrap());
    assert_eq!(last.tls.as_ref().unwrap().error.as_deref(), Some("TLS handshake not finished within 0.1 s"));
    stop.cancel();
    task.await.unwrap();
}

/// Passed once, a check can be degraded; failing since start it stays "never passed".
#[test]
fn a_check_remembers_whether_it_ever_passed() {
    let failed = || Err("connect: Connection refused".to_string());
    let first = Check::after(None, "t".into(), failed(), 1);
    let second = Check::after(Some(&first), "t".into(), failed(), 2);
    let third = Check::after(Some(&second), "t".into(), failed(), 3);
    assert!(!third.passed_once && third.failures == 3 && third.never_worked());
    let fourth = Check::after(Some(&third), "t".into(), failed(), 4);
    assert!(!fourth.never_worked(), "one warning, not one a check");
    let passed = Check::after(Some(&fourth), "t".into(), Ok(()), 5);
    let after = Check::after(Some(&passed), "t".into(), failed(), 6);
    assert!(after.passed_once && after.failing_since_unix_ns == Some(6) && !after.never_worked());
}

#[test]
fn addresses_are_checked() {
    assert!(healthz_url("https://127.0.0.1:10248/healthz").is_err());
    assert!(healthz_url("127.0.0.1:10248").is_err());
    assert_eq!(server_address("127.0.0.1:10250").unwrap(), "127.0.0.1:10250");
    assert!(server_address("127.0.0.1").is_err() && server_address(":10250").is_err());
    assert!(server_address("node:0").is_err());
}
