//! The cluster's certificates and kubeconfigs: one CA, the API server's serving certificate, a
//! client certificate each for the admin (system:masters) and the kubelet (system:node:NODE),
//! the service-account signing key. Made once per state directory.

use std::{path::Path, process::Command};

use anyhow::Context as _;

use super::NODE;
use crate::bootstrap::run_step;

pub fn ensure(dir: &Path) -> anyhow::Result<()> {
    if dir.join("admin.kubeconfig").exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cluster: create {}", dir.display()))?;
    let openssl =
        |args: &[&str], what: &str| run_step(Command::new("openssl").args(args).current_dir(dir), what);
    openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "3650",
            "-subj",
            "/CN=kstall-cluster-ca",
        ],
        "openssl: the cluster's CA",
    )?;
    sign(
        dir,
        "apiserver",
        "/CN=kube-apiserver",
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,\
         DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n",
    )?;
    sign(dir, "admin", "/O=system:masters/CN=admin", "extendedKeyUsage=clientAuth\n")?;
    sign(dir, "kubelet", &format!("/O=system:nodes/CN=system:node:{NODE}"), "extendedKeyUsage=clientAuth\n")?;
    openssl(&["genrsa", "-out", "sa.key", "2048"], "openssl: the service-account key")?;
    openssl(&["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"], "openssl: the service-account key")?;
    for (name, cert) in [("kubelet", "kubelet"), ("admin", "admin")] {
        std::fs::write(dir.join(format!("{name}.kubeconfig")), kubeconfig(dir, cert))?;
    }
    Ok(())
}

fn sign(dir: &Path, name: &str, subject: &str, extensions: &str) -> anyhow::Result<()> {
    std::fs::write(dir.join(format!("{name}.ext")), extensions)?;
    let key = format!("{name}.key");
    let csr = format!("{name}.csr");
    let crt = format!("{name}.crt");
    let ext = format!("{name}.ext");
    run_step(
        Command::new("openssl")
            .args(["req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subject])
            .current_dir(dir),
        &format!("openssl: {name}'s key"),
    )?;
    run_step(
        Command::new("openssl")
            .args(["x509", "-req", "-in", &csr, "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial"])
            .args(["-out", &crt, "-days", "3650", "-extfile", &ext])
            .current_dir(dir),
        &format!("openssl: {name}'s certificate"),
    )
}

fn kubeconfig(dir: &Path, cert: &str) -> String {
    let d = dir.display();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kstall-cluster\n  cluster: {{server: \"https://127.0.0.1:6443\", \
         certificate-authority: \"{d}/ca.crt\"}}\nusers:\n- name: {cert}\n  user: {{client-certificate: \"{d}/{cert}.crt\", \
         client-key: \"{d}/{cert}.key\"}}\ncontexts:\n- name: {cert}\n  context: {{cluster: kstall-cluster, user: {cert}}}\n\
         current-context: {cert}\n"
    )
}
