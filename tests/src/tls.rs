//! Certificates a test makes with openssl: a CA, a server certificate for 127.0.0.1 and a client
//! certificate, both signed by it (rustls takes no self-signed leaf as its own trust anchor).

use std::{path::Path, process::Command};

/// Writes `ca.crt`/`ca.key`, `server.crt`/`server.key` (for IP 127.0.0.1) and
/// `client.crt`/`client.key` (CN `client`) into `dir`.
pub fn make_certificates(dir: &Path) {
    let openssl = |args: &str| {
        let args: Vec<&str> = args.split_whitespace().collect();
        let out = Command::new("openssl").args(&args).current_dir(dir).output().expect("run openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let new_key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    openssl(&format!("req -x509 {new_key} -keyout ca.key -out ca.crt -days 1 -subj /CN=kstall-test-ca"));
    std::fs::write(dir.join("server.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    for (name, cn) in [("server", "kstall-test-server"), ("client", "client")] {
        openssl(&format!("req {new_key} -keyout {name}.key -out {name}.csr -subj /CN={cn}"));
        openssl(&format!(
            "x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out {name}.crt -days 1 \
             -extfile {name}.ext"
        ));
    }
}
