//! One export request to the endpoint, over gRPC (opentelemetry-proto's generated LogsService
//! client on a tonic channel) or HTTP (the protobuf body POSTed to `/v1/logs`), with the headers
//! and TLS the settings name. Says whether a failure is worth retrying, as the OTLP specification
//! lists the retryable gRPC codes and HTTP statuses.

use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse, logs_service_client::LogsServiceClient,
};
use prost::Message as _;
use tonic::{
    Code,
    metadata::{Ascii, MetadataKey, MetadataValue},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};

use super::settings::{Protocol, Settings};
use crate::{attribution::pods::api::ErrorChain, export::tls};

/// Why an export failed, and whether the same request may go again.
#[derive(Debug)]
pub struct Failure {
    pub retryable: bool,
    pub message: String,
}

pub enum Transport {
    Grpc(Grpc),
    Http(Box<Http>),
}

pub struct Grpc {
    client: LogsServiceClient<Channel>,
    headers: Vec<(MetadataKey<Ascii>, MetadataValue<Ascii>)>,
}

pub struct Http {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    endpoint: hyper::Uri,
    headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    timeout: Duration,
}

impl Transport {
    /// Certificates and keys are read now: a bad one is a start error, not a failed export.
    pub fn new(settings: &Settings) -> Result<Self, String> {
        let https = settings.endpoint.starts_with("https://");
        let read = |path: &std::path::Path| crate::named_file::read(path, 1 << 20);
        match settings.protocol {
            Protocol::Grpc => {
                let mut endpoint = Endpoint::from_shared(settings.endpoint.clone())
                    .map_err(|e| format!("{}: {e}", settings.endpoint))?
                    .timeout(settings.timeout)
                    .connect_timeout(settings.timeout);
                if https {
                    let mut config = match &settings.certificate {
                        Some(path) => {
                            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(path)?))
                        }
                        None => ClientTlsConfig::new().with_native_roots(),
                    };
                    if let Some((cert, key)) = &settings.client {
                        config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
                    }
                    endpoint = endpoint.tls_config(config).map_err(|e| format!("TLS: {e}"))?;
                }
                let headers = settings
                    .headers
                    .iter()
                    .map(|(k, v)| {
                        let key = MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                            .map_err(|e| format!("header {k:?}: {e}"))?;
                        let value =
                            MetadataValue::try_from(v.as_str()).map_err(|e| format!("header {k:?}: {e}"))?;
                        Ok((key, value))
                    })
                    .collect::<Result<_, String>>()?;
                Ok(Transport::Grpc(Grpc { client: LogsServiceClient::new(endpoint.connect_lazy()), headers }))
            }
            Protocol::HttpProtobuf => {
                let config = if https { https_config(settings)? } else { tls::plain_http_only() };
                let connector = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(config)
                    .https_or_http()
                    .enable_http1()
                    .build();
                let endpoint: hyper::Uri =
                    settings.endpoint.parse().map_err(|e| format!("{}: {e}", settings.endpoint))?;
                let client = Client::builder(TokioExecutor::new()).build(connector);
                let headers = http_headers(settings)?;
                Ok(Transport::Http(Box::new(Http { client, endpoint, headers, timeout: settings.timeout })))
            }
        }
    }

    /// What [`Transport::new`] needs, checked without connecting or a runtime: a start error
    /// names the bad part.
    pub fn check(settings: &Settings) -> Result<(), String> {
        settings.endpoint.parse::<hyper::Uri>().map_err(|e| format!("{}: {e}", settings.endpoint))?;
        http_headers(settings)?;
        if settings.endpoint.starts_with("https://") {
            https_config(settings)?;
        }
        Ok(())
    }

    /// Sends `request`; on success, how many records the endpoint says it rejected.
    pub async fn send(&mut self, request: ExportLogsServiceRequest) -> Result<u64, Failure> {
        let response = match self {
            Transport::Grpc(Grpc { client, headers }) => {
                let mut call = tonic::Request::new(request);
                for (key, value) in headers.iter() {
                    call.metadata_mut().insert(key.clone(), value.clone());
                }
                match client.export(call).await {
                    Ok(response) => response.into_inner(),
                    Err(status) => {
                        let retryable = matches!(
                            status.code(),
                            Code::Cancelled
                                | Code::DeadlineExceeded
                                | Code::ResourceExhausted
                                | Code::Aborted
                                | Code::OutOfRange
                                | Code::Unavailable
                                | Code::DataLoss
                        );
                        return Err(Failure {
                            retryable,
                            message: format!("gRPC {:?}: {}", status.code(), status.message()),
                        });
                    }
                }
            }
            Transport::Http(http) => {
                let Http { client, endpoint, headers, timeout } = http.as_mut();
                let mut post = hyper::Request::post(endpoint.clone())
                    .header(hyper::header::CONTENT_TYPE, "application/x-protobuf");
                for (name, value) in headers.iter() {
                    post = post.header(name, value);
                }
                let post = post
                    .body(Full::new(Bytes::from(request.encode_to_vec())))
                    .map_err(|e| Failure { retryable: false, message: e.to_string() })?;
                let exchange = async {
                    let response = client
                        .request(post)
                        .await
                        .map_err(|e| Failure { retryable: true, message: ErrorChain(&e).to_string() })?;
                    let status = response.status();
                    let body = response
                        .into_body()
                        .collect()
                        .await
                        .map_err(|e| Failure { retryable: true, message: e.to_string() })?
                        .to_bytes();
                    Ok::<_, Failure>((status, body))
                };
                let (status, body) = tokio::time::timeout(*timeout, exchange).await.map_err(|_| {
                    Failure { retryable: true, message: format!("no answer within {timeout:?}") }
                })??;
                if !status.is_success() {
                    let retryable = matches!(status.as_u16(), 429 | 502 | 503 | 504);
                    let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
                    return Err(Failure { retryable, message: format!("HTTP {status}: {text}") });
                }
                ExportLogsServiceResponse::decode(body).unwrap_or_default()
            }
        };
        Ok(response.partial_success.map_or(0, |p| p.rejected_log_records.max(0) as u64))
    }
}

/// The settings' headers as HTTP has them (gRPC metadata takes the same names, lower-cased).
fn http_headers(
    settings: &Settings,
) -> Result<Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>, String> {
    settings
        .headers
        .iter()
        .map(|(k, v)| {
            let name =
                hyper::header::HeaderName::try_from(k.as_str()).map_err(|e| format!("header {k:?}: {e}"))?;
            let value =
                hyper::header::HeaderValue::try_from(v.as_str()).map_err(|e| format!("header {k:?}: {e}"))?;
            Ok((name, value))
        })
        .collect()
}

/// TLS for an `https://` endpoint over HTTP: the settings' CA and client certificate.
fn https_config(settings: &Settings) -> Result<rustls::ClientConfig, String> {
    let client_auth = settings.client.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    tls::client_config(settings.certificate.as_deref(), client_auth)
}
