//! An OTLP logs receiver built from the protocol's definitions: opentelemetry-proto's generated
//! LogsService server for gRPC, and the same messages POSTed to `/v1/logs` for HTTP — what a
//! Collector's `otlp` receiver takes (no collector binary is obtainable here). It keeps every
//! request with its headers for the test to read, and can be told to refuse (gRPC UNAVAILABLE,
//! HTTP 503) to show what the agent does then.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::SocketAddr,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
};

use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response, StatusCode, body::Bytes, service::service_fn};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::{
    collector::logs::v1::{
        ExportLogsServiceRequest, ExportLogsServiceResponse,
        logs_service_server::{LogsService, LogsServiceServer},
    },
    common::v1::any_value::Value,
    logs::v1::LogRecord,
};
use prost::Message as _;
use tokio::sync::oneshot;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    Http,
}

/// The receiver's TLS: its certificate and key, and with `client_ca` the CA its clients'
/// certificates must chain to (mutual TLS).
pub struct Tls<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
    pub client_ca: Option<&'a Path>,
}

/// One export as it arrived.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: BTreeMap<String, String>,
    pub request: ExportLogsServiceRequest,
}

/// A log record with its resource's string attributes.
#[derive(Debug, Clone)]
pub struct Record {
    pub resource: BTreeMap<String, String>,
    pub record: LogRecord,
}

impl Record {
    /// The record's integer attribute `key`.
    pub fn int(&self, key: &str) -> Option<i64> {
        self.record.attributes.iter().find(|a| a.key == key).and_then(|a| {
            match a.value.as_ref()?.value.as_ref()? {
                Value::IntValue(i) => Some(*i),
                _ => None,
            }
        })
    }

    /// The body's map as JSON, for assertions on what the kstall/v1 record said.
    pub fn body(&self) -> serde_json::Value {
        self.record.body.as_ref().map(json).unwrap_or_default()
    }
}

fn json(value: &opentelemetry_proto::tonic::common::v1::AnyValue) -> serde_json::Value {
    match &value.value {
        Some(Value::StringValue(s)) => s.clone().into(),
        Some(Value::BoolValue(b)) => (*b).into(),
        Some(Value::IntValue(i)) => (*i).into(),
        Some(Value::DoubleValue(d)) => (*d).into(),
        Some(Value::ArrayValue(a)) => a.values.iter().map(json).collect(),
        Some(Value::KvlistValue(map)) => map
            .values
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.as_ref().map(json).unwrap_or_default()))
            .collect(),
        _ => serde_json::Value::Null,
    }
}

#[derive(Default)]
struct Shared {
    received: Mutex<Vec<Received>>,
    refusing: AtomicBool,
}

pub struct Receiver {
    pub addr: SocketAddr,
    pub protocol: Protocol,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Receiver {
    /// Listening on 127.0.0.1, on a thread of its own, until dropped.
    pub fn start(protocol: Protocol, tls: Option<Tls>) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let listener =
            runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("a port for the receiver");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let served = shared.clone();
        let tls = tls.map(|t| server_config(&t));
        let thread = thread::spawn(move || {
            runtime.block_on(async move {
                match protocol {
                    Protocol::Grpc => serve_grpc(listener, tls, served, stopped).await,
                    Protocol::Http => serve_http(listener, tls, served, stopped).await,
                }
            })
        });
        Self { addr, protocol, shared, stop: Some(stop), thread: Some(thread) }
    }

    /// The endpoint to give the agent: for HTTP its `/v1/logs`, for gRPC the server.
    pub fn endpoint(&self, https: bool) -> String {
        let scheme = if https { "https" } else { "http" };
        match self.protocol {
            Protocol::Grpc => format!("{scheme}://{}", self.addr),
            Protocol::Http => format!("{scheme}://{}/v1/logs", self.addr),
        }
    }

    /// From now on, every export is refused as the endpoint being unavailable (or taken again).
    pub fn refuse(&self, refusing: bool) {
        self.shared.refusing.store(refusing, Ordering::SeqCst);
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
    }

    /// Every record taken so far, with its resource.
    pub fn records(&self) -> Vec<Record> {
        let mut records = Vec::new();
        for received in self.received() {
            for resource_logs in received.request.resource_logs {
                let resource: BTreeMap<String, String> = resource_logs
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .filter_map(|a| match a.value.as_ref()?.value.as_ref()? {
                        Value::StringValue(s) => Some((a.key.clone(), s.clone())),
                        _ => None,
                    })
                    .collect();
                for scope_logs in resource_logs.scope_logs {
                    for record in scope_logs.log_records {
                        records.push(Record { resource: resource.clone(), record });
                    }
                }
            }
        }
        records
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn server_config(tls: &Tls) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer> =
        CertificateDer::pem_file_iter(tls.cert).unwrap().collect::<Result<_, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_file(tls.key).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match tls.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca).unwrap() {
                roots.add(cert.unwrap()).unwrap();
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// Accepts connections until `stopped`, each through TLS when given, served by `serve`.
async fn accept<F, Fut>(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut stopped: oneshot::Receiver<()>,
    serve: F,
) where
    F: Fn(Box<dyn Io>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted { Ok((s, _)) => s, Err(_) => continue },
        };
        let (acceptor, serve) = (acceptor.clone(), serve.clone());
        tokio::spawn(async move {
            let io: Box<dyn Io> = match acceptor {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(tls) => Box::new(tls),
                    Err(_) => return,
                },
                None => Box::new(stream),
            };
            serve(io).await;
        });
    }
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

struct Logs(Arc<Shared>);

#[tonic::async_trait]
impl LogsService for Logs {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        if self.0.refusing.load(Ordering::SeqCst) {
            return Err(tonic::Status::unavailable("the test's receiver refuses"));
        }
        let headers = request
            .metadata()
            .clone()
            .into_headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        self.0.received.lock().unwrap().push(Received { headers, request: request.into_inner() });
        Ok(tonic::Response::new(ExportLogsServiceResponse::default()))
    }
}

async fn serve_grpc(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shared: Arc<Shared>,
    stopped: oneshot::Receiver<()>,
) {
    let service = LogsServiceServer::new(Logs(shared));
    accept(listener, tls, stopped, move |io| {
        let service = service.clone();
        async move {
            let service = hyper_util::service::TowerToHyperService::new(service);
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(TokioIo::new(io), service)
                .await;
        }
    })
    .await;
}

async fn serve_http(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shared: Arc<Shared>,
    stopped: oneshot::Receiver<()>,
) {
    accept(listener, tls, stopped, move |io| {
        let shared = shared.clone();
        async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(take(&shared, request).await) }
            });
            let _ =
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), service).await;
        }
    })
    .await;
}

/// One POST of the HTTP receiver.
async fn take(shared: &Shared, request: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: Vec<u8>| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert("content-type", "application/x-protobuf".parse().unwrap());
        response
    };
    if request.uri().path() != "/v1/logs" || request.method() != hyper::Method::POST {
        return reply(StatusCode::NOT_FOUND, vec![]);
    }
    if shared.refusing.load(Ordering::SeqCst) {
        return reply(StatusCode::SERVICE_UNAVAILABLE, vec![]);
    }
    let headers = request
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let Ok(body) = request.into_body().collect().await else { return reply(StatusCode::BAD_REQUEST, vec![]) };
    match ExportLogsServiceRequest::decode(body.to_bytes()) {
        Ok(request) => {
            shared.received.lock().unwrap().push(Received { headers, request });
            reply(StatusCode::OK, ExportLogsServiceResponse::default().encode_to_vec())
        }
        Err(_) => reply(StatusCode::BAD_REQUEST, vec![]),
    }
}
