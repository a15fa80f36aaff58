//! The web configuration of `/metrics` (`--web-config-file`): the YAML file of the Prometheus
//! exporter toolkit, as node_exporter takes it — TLS (certificate and key, client certificates
//! checked against a CA), basic-auth users with bcrypt hashes, response headers. Relative paths are
//! relative to the file, as there. What kstall does not do is an error naming the key, never
//! silently ignored: a setting an operator relies on for security must not be dropped.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::SystemTime,
};

use rustls::{
    pki_types::{PrivateKeyDer, pem::PemObject as _},
    server::WebPkiClientVerifier,
};
use serde::Deserialize;

use crate::named_file;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    http_server_config: Option<HttpFile>,
    basic_auth_users: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    client_auth_type: Option<String>,
    client_ca_file: Option<PathBuf>,
    min_version: Option<String>,
    max_version: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    /// Taken for node_exporter's files' sake; kstall speaks HTTP/1.1, which every scraper does.
    #[serde(rename = "http2")]
    _http2: Option<bool>,
    headers: Option<BTreeMap<String, String>>,
}

/// The web configuration, ready to serve with.
#[derive(Clone)]
pub struct WebConfig {
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// User -> bcrypt hash; empty: no authentication.
    pub users: Arc<BTreeMap<String, String>>,
    pub headers: Vec<(String, String)>,
    /// The files it was read from, with their modification times: changed files are read again
    /// (a renewed certificate is served without a restart).
    pub sources: Vec<(PathBuf, Option<SystemTime>)>,
}

impl WebConfig {
    /// Whether any of its files changed since it was read.
    pub fn changed_on_disk(&self) -> bool {
        self.sources.iter().any(|(path, seen)| modified(path) != *seen)
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Reads and checks the file: the certificate and key load, the hashes are bcrypt's.
pub fn load(path: &Path) -> Result<WebConfig, String> {
    let text = named_file::read_text(path, named_file::CONFIG_MAX_BYTES)?;
    let file: File = if text.trim().is_empty() {
        File::default()
    } else {
        serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
    };
    let base = path.parent().unwrap_or(Path::new("."));
    let mut sources = vec![(path.to_path_buf(), modified(path))];
    let mut resolve = |p: &Path| {
        let full = base.join(p);
        sources.push((full.clone(), modified(&full)));
        full
    };
    let tls = match file.tls_server_config {
        None => None,
        Some(tls) => Some(Arc::new(server_config(tls, &mut resolve)?)),
    };
    let users = file.basic_auth_users.unwrap_or_default();
    for (user, hash) in &users {
        if user.contains(':') {
            return Err(format!(
                "basic_auth_users: user {user:?} contains ':', which basic auth cannot carry"
            ));
        }
        hash.parse::<bcrypt::HashParts>()
            .map_err(|e| format!("basic_auth_users: {user}'s password is not a bcrypt hash ({e})"))?;
    }
    let headers = file.http_server_config.and_then(|h| h.headers).unwrap_or_default();
    for (name, value) in &headers {
        axum::http::HeaderName::try_from(name.as_str())
            .map_err(|_| format!("http_server_config.headers: {name:?} is not a header name"))?;
        axum::http::HeaderValue::try_from(value.as_str())
            .map_err(|_| format!("http_server_config.headers: {name}'s value is not a header value"))?;
    }
    Ok(WebConfig { tls, users: Arc::new(users), headers: headers.into_iter().collect(), sources })
}

fn server_config(
    tls: TlsFile,
    resolve: &mut impl FnMut(&Path) -> PathBuf,
) -> Result<rustls::ServerConfig, String> {
    let (Some(cert_file), Some(key_file)) = (&tls.cert_file, &tls.key_file) else {
        return Err("tls_server_config: needs cert_file and key_file".into());
    };
    let (cert_file, key_file) = (resolve(cert_file), resolve(key_file));
    let certs =
        named_file::certificates(&cert_file).map_err(|e| format!("tls_server_config.cert_file {e}"))?;
    if certs.is_empty() {
        return Err(format!("tls_server_config.cert_file {}: no certificate in it", cert_file.display()));
    }
    let key = named_file::read(&key_file, named_file::CONFIG_MAX_BYTES)
        .and_then(|pem| {
            PrivateKeyDer::from_pem_slice(&pem).map_err(|e| format!("{}: {e}", key_file.display()))
        })
        .map_err(|e| format!("tls_server_config.key_file {e}"))?;
    let versions = versions(tls.min_version.as_deref(), tls.max_version.as_deref())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| format!("tls_server_config: {e}"))?;
    let client_auth = tls.client_auth_type.as_deref().unwrap_or("NoClientCert");
    let builder = match client_auth {
        "NoClientCert" => {
            if tls.client_ca_file.is_some() {
                return Err("tls_server_config: client_ca_file needs a client_auth_type that verifies \
                            (RequireAndVerifyClientCert, VerifyClientCertIfGiven)"
                    .into());
            }
            builder.with_no_client_auth()
        }
        "RequireAndVerifyClientCert" | "VerifyClientCertIfGiven" => {
            let Some(ca_file) = &tls.client_ca_file else {
                return Err(format!(
                    "tls_server_config: client_auth_type {client_auth} needs client_ca_file"
                ));
            };
            let ca_file = resolve(ca_file);
            let mut roots = rustls::RootCertStore::empty();
            let cas = named_file::certificates(&ca_file)
                .map_err(|e| format!("tls_server_config.client_ca_file {e}"))?;
            let (added, _) = roots.add_parsable_certificates(cas);
            if added == 0 {
                return Err(format!(
                    "tls_server_config.client_ca_file {}: no CA certificate in it",
                    ca_file.display()
                ));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match client_auth {
                "VerifyClientCertIfGiven" => verifier.allow_unauthenticated(),
                _ => verifier,
            };
            builder
                .with_client_cert_verifier(verifier.build().map_err(|e| format!("tls_server_config: {e}"))?)
        }
        "RequestClientCert" | "RequireAnyClientCert" => {
            return Err(format!(
                "tls_server_config: client_auth_type {client_auth} (a certificate taken unverified) is not \
                 supported: use RequireAndVerifyClientCert or VerifyClientCertIfGiven with client_ca_file"
            ));
        }
        other => {
            return Err(format!(
                "tls_server_config: client_auth_type {other:?} is not one of NoClientCert, \
                 VerifyClientCertIfGiven, RequireAndVerifyClientCert"
            ));
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls_server_config: the key does not go with the certificate ({e})"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// TLS 1.2 and 1.3 (rustls has no older ones), as `min_version`/`max_version` allow.
fn versions(
    min: Option<&str>,
    max: Option<&str>,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, String> {
    let rank = |field: &str, v: &str| match v {
        "TLS12" => Ok(12),
        "TLS13" => Ok(13),
        "TLS10" | "TLS11" => {
            Err(format!("tls_server_config.{field}: {v} is not offered (TLS12 and TLS13 are)"))
        }
        other => Err(format!("tls_server_config.{field}: {other:?} is not TLS12 or TLS13")),
    };
    let low = min.map(|v| rank("min_version", v)).transpose()?.unwrap_or(12);
    let high = max.map(|v| rank("max_version", v)).transpose()?.unwrap_or(13);
    let versions: Vec<_> = [(12, &rustls::version::TLS12), (13, &rustls::version::TLS13)]
        .into_iter()
        .filter(|(n, _)| (low..=high).contains(n))
        .map(|(_, v)| v)
        .collect();
    if versions.is_empty() {
        return Err("tls_server_config: min_version is above max_version".into());
    }
    Ok(versions)
}

/// Whether an `Authorization` header names a configured user with the right password. bcrypt
/// is slow by design (tens of milliseconds): the caller runs this off the async threads.
pub fn authorized(users: &BTreeMap<String, String>, authorization: Option<&str>) -> bool {
    use base64::Engine as _;
    let Some(encoded) = authorization.and_then(|a| a.strip_prefix("Basic ")) else { return false };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else { return false };
    let Ok(decoded) = String::from_utf8(decoded) else { return false };
    let Some((user, password)) = decoded.split_once(':') else { return false };
    users.get(user).is_some_and(|hash| bcrypt::verify(password, hash).unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn basic_auth_checks_the_bcrypt_hash() {
        use base64::Engine as _;
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let users = BTreeMap::from([("prometheus".to_string(), hash)]);
        let header =
            |creds: &str| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(creds));
        assert!(authorized(&users, Some(&header("prometheus:s3cret"))));
        for wrong in ["prometheus:nope", "other:s3cret", "prometheus", ""] {
            assert!(!authorized(&users, Some(&header(wrong))), "{wrong}");
        }
        assert!(!authorized(&users, None));
        assert!(!authorized(&users, Some("Bearer x")));
        assert!(!authorized(&users, Some("Basic !!!")));
    }

    #[test]
    fn each_bad_setting_is_one_line_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("tls_server_config: {cert_file: a.pem}\n", "needs cert_file and key_file"),
            ("tls_server_config: {cert_file: nope.pem, key_file: nope.key}\n", "tls_server_config.cert_file"),
            ("basic_auth_users: {alice: plaintext}\n", "alice's password is not a bcrypt hash"),
            ("basic_auth_users: {\"a:b\": x}\n", "contains ':'"),
            ("http_server_config: {headers: {\"bad header\": x}}\n", "is not a header name"),
            ("tls_server_config: {cipher_suites: [x]}\n", "unknown field `cipher_suites`"),
            ("tls_config: {}\n", "unknown field `tls_config`"),
            ("basic_auth_users: [alice]\n", "basic_auth_users"),
        ];
        for (text, expected) in cases {
            let path = write(dir.path(), "web.yml", text);
            let err = load(&path).err().unwrap_or_else(|| panic!("{text} loaded"));
            assert!(err.contains(expected), "{text}: {err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
        assert_eq!(
            versions(Some("TLS13"), Some("TLS12")).unwrap_err(),
            "tls_server_config: min_version is above max_version"
        );
        assert!(versions(Some("TLS10"), None).unwrap_err().contains("not offered"));
        assert_eq!(versions(Some("TLS13"), None).unwrap().len(), 1);
    }

    #[test]
    fn an_empty_file_is_plain_http_without_auth() {
        let dir = tempfile::tempdir().unwrap();
        let web = load(&write(dir.path(), "web.yml", "")).unwrap();
        assert!(web.tls.is_none() && web.users.is_empty() && web.headers.is_empty());
        assert!(!web.changed_on_disk());
    }
}
