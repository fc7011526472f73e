//! A private PKI for the TLS tests ([`Pki`]): a CA, server certificates it signs, and an unrelated CA,
//! made by the `openssl` CLI in a temp dir. tests/tls.rs serves them from MariaDB, tests/schema_registry.rs
//! from the Schema Registry.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use tempfile::TempDir;

use super::ServerTls;

/// Certificates made for one test by the `openssl` CLI in a temp dir (EC P-256, valid for two days).
pub struct Pki {
    dir: TempDir,
}

impl Pki {
    /// A CA; a server certificate it signs for `IP:127.0.0.1` and `DNS:localhost`; one it signs for
    /// another name only; and a second, unrelated CA.
    pub fn new() -> Pki {
        let pki = Pki { dir: tempfile::Builder::new().prefix("tls-pki-").tempdir().expect("create PKI temp dir") };
        pki.ca("ca");
        pki.ca("wrong-ca");
        pki.server("server", "ca", "IP:127.0.0.1,DNS:localhost");
        pki.server("nameless", "ca", "DNS:db.example.test");
        pki
    }

    /// A file in the PKI dir (each certificate `<name>.pem`, its key `<name>.key`).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA that signed both server certificates.
    pub fn ca_pem(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// A CA that signed neither.
    pub fn wrong_ca_pem(&self) -> PathBuf {
        self.path("wrong-ca.pem")
    }

    /// The server certificate for `127.0.0.1` and `localhost`.
    pub fn server_tls(&self) -> ServerTls {
        self.server_files("server")
    }

    /// A server certificate from the same CA that names neither `127.0.0.1` nor `localhost`.
    pub fn nameless_tls(&self) -> ServerTls {
        self.server_files("nameless")
    }

    fn server_files(&self, name: &str) -> ServerTls {
        ServerTls { cert: self.path(&format!("{name}.pem")), key: self.path(&format!("{name}.key")), ca: self.ca_pem() }
    }

    fn ca(&self, name: &str) {
        self.openssl(&[
            "req",
            "-x509",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN=outbox-cdc test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
    }

    fn server(&self, name: &str, ca: &str, subject_alt_names: &str) {
        self.openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN=outbox-cdc test {name}"),
        ]);
        let extensions = format!(
            "subjectAltName={subject_alt_names}\nbasicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        );
        std::fs::write(self.path(&format!("{name}.ext")), extensions).expect("write extensions file");
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ]);
    }

    /// Runs `openssl <args>` in the PKI dir.
    ///
    /// # Panics
    /// When the CLI is missing or fails; the message carries its output.
    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run the openssl CLI (needed to make the test certificates): {e}"));
        assert!(
            out.status.success(),
            "openssl {args:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
