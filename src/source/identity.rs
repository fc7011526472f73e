//! Who the connector is to the database server (`[source] auth`): the configured password, or a short-lived
//! token of the cloud identity it runs as, made afresh for each connection attempt.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2 (vocabulary, error, config).
//!
//! # Invariants
//! - Every connection the connector opens asks [`Identity::login`] first (through `SourceConn::connect`, the
//!   only place that opens one), so a token is never older than the attempt that sends it: RDS tokens live
//!   15 minutes, access tokens about an hour, and a binlog connection lives for days.
//! - A token never reaches a log or a message: it travels as a [`Secret`] (whose `Debug` prints `***`), and
//!   what messages say is [`Login::who`], the identity (auth kind, the AWS access key id's last four
//!   characters and region, or where the token came from).
//! - A token is sent with the cleartext plugin; config validation allows that only over TLS that verifies
//!   the server (`config::source`).
//!
//! # Why cache, and what
//! An RDS token is signed locally, so it is made for every attempt; only the AWS credentials behind it are
//! kept until five minutes before they expire (the SDK's web-identity and container providers make a
//! network call each time they are asked). A metadata endpoint's access token is kept until a minute
//! before its `expires_in` ends. A `token_file` is read again at every attempt: the file's writer (the
//! kubelet, a sidecar) is the cache.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;

use crate::config::{Auth, AuthKind, Connection, TokenCloud, TokenFrom};
use crate::error::{Error, Result};
use crate::schema::registry::encode_path;
use crate::secret::Secret;

/// How long an RDS IAM auth token is valid (RDS accepts at most 15 minutes).
pub const RDS_TOKEN_LIFETIME: Duration = Duration::from_secs(900);
/// The SigV4 service name of RDS IAM database authentication.
const RDS_SERVICE: &str = "rds-db";
/// AWS credentials are asked for again this long before they expire.
const CREDENTIALS_MARGIN: Duration = Duration::from_secs(300);
/// A metadata endpoint's access token is asked for again this long before it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(60);
/// How long a metadata endpoint may take to answer.
const ENDPOINT_TIMEOUT: Duration = Duration::from_secs(10);

/// What to log in with, for one connection attempt.
pub struct Login {
    /// The password to send (`None`: no password).
    pub password: Option<Secret>,
    /// Send it with the cleartext plugin (`mysql_clear_password`), as RDS, Cloud SQL and Azure ask of tokens.
    pub cleartext: bool,
    /// Who logs in, for messages: never the secret.
    pub who: String,
}

/// Where the password of each connection attempt comes from; clones share the caches.
#[derive(Clone)]
pub struct Identity {
    source: Source,
    /// [`Login::who`] of the last attempt, for `outbox-cdc check`.
    last: Arc<Mutex<Option<String>>>,
}

#[derive(Clone)]
enum Source {
    /// The configured password, resolved once when the connector starts (as it always was).
    Password(Option<Secret>),
    /// An RDS IAM auth token.
    Aws(Arc<AwsCredentials>),
    /// An OAuth access token.
    Token(Arc<AccessToken>),
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("auth", &self.kind().name()).finish_non_exhaustive()
    }
}

impl Identity {
    /// The identity `connection` configures; the password keys are read now.
    ///
    /// # Errors
    /// As [`Connection::password`].
    pub fn new(connection: &Connection) -> Result<Self> {
        let source = match &connection.auth {
            Auth::Password => Source::Password(connection.password()?),
            Auth::AwsIam { region } => Source::Aws(Arc::new(AwsCredentials::new("source", region.clone()))),
            Auth::Token { cloud, from } => {
                Source::Token(Arc::new(AccessToken { cloud: *cloud, from: from.clone(), cached: Mutex::new(None) }))
            }
        };
        Ok(Identity { source, last: Arc::default() })
    }

    /// The configured `source.auth`.
    pub fn kind(&self) -> AuthKind {
        match &self.source {
            Source::Password(_) => AuthKind::Password,
            Source::Aws(_) => AuthKind::AwsIam,
            Source::Token(token) => match token.cloud {
                TokenCloud::Gcp => AuthKind::GcpIam,
                TokenCloud::Azure => AuthKind::AzureAd,
            },
        }
    }

    /// What to log in to `host:port` as `user` with, made now.
    ///
    /// # Errors
    /// Definite when the identity cannot be had as configured (no AWS region, an empty token file);
    /// transient when its source did not answer (the credential chain, the metadata endpoint).
    pub async fn login(&self, host: &str, port: u16, user: &str) -> Result<Login> {
        let login = match &self.source {
            Source::Password(password) => {
                Login { password: password.clone(), cleartext: false, who: format!("user {user} with a password") }
            }
            Source::Aws(aws) => {
                let (credentials, region) = aws.credentials().await?;
                let token = rds_auth_token(&credentials, &region, host, port, user, SystemTime::now())?;
                let key = credentials.access_key_id();
                let tail = &key[key.len().saturating_sub(4)..];
                Login {
                    password: Some(token),
                    cleartext: true,
                    who: format!("user {user} by auth = \"aws_iam\" (access key id ...{tail}, region {region})"),
                }
            }
            Source::Token(token) => {
                let (secret, from) = token.get().await?;
                let kind = self.kind().name();
                Login {
                    password: Some(secret),
                    cleartext: true,
                    who: format!("user {user} by auth = \"{kind}\" ({from})"),
                }
            }
        };
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(login.who.clone());
        Ok(login)
    }

    /// [`Login::who`] of the last attempt, if one was made.
    pub fn last_login(&self) -> Option<String> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The extra diagnosis for a server's access-denied answer (1045) to this identity, if it has one.
    pub fn denied_hint(&self) -> Option<&'static str> {
        match self.kind() {
            AuthKind::Password => None,
            AuthKind::AwsIam => Some(
                "The server refused the RDS IAM auth token. Likely causes: the database user was not created \
                 IDENTIFIED WITH AWSAuthenticationPlugin AS 'RDS' (MariaDB/MySQL on RDS); the IAM policy of the \
                 connector's role lacks rds-db:connect on arn:aws:rds-db:<region>:<account>:dbuser:\
                 <DbiResourceId>/<user> (the instance's resource id, not its name); the token was signed for \
                 another region (source.aws_region) or another host name than the instance's endpoint; IAM \
                 database authentication is not enabled on the instance; the machine's clock is off by more \
                 than a few minutes. See docs/MANAGED-MYSQL.md",
            ),
            AuthKind::GcpIam => Some(
                "The server refused the access token. Likely causes: the service account is not a Cloud SQL \
                 IAM database user (gcloud sql users create <sa-name>@<project>.iam \
                 --type=cloud_iam_service_account), source.user is not its MySQL name (the e-mail up to the @), \
                 the instance's cloudsql_iam_authentication flag is off, the service account lacks \
                 roles/cloudsql.instanceUser, or the token expired. See docs/MANAGED-MYSQL.md",
            ),
            AuthKind::AzureAd => Some(
                "The server refused the access token. Likely causes: no Microsoft Entra admin is set on the \
                 server, the database user was not created for this identity (CREATE AADUSER), the token was \
                 issued for another resource than https://ossrdbms-aad.database.windows.net, or it expired. \
                 See docs/MANAGED-MYSQL.md",
            ),
        }
    }
}

/// `auth = "aws_iam"` (`[source]` and `[kafka]`): the SDK's default credential chain, loaded once, and the
/// last credentials it gave.
pub struct AwsCredentials {
    /// The config section it is for (`source`, `kafka`), for messages.
    section: &'static str,
    /// `<section>.aws_region`.
    region: Option<String>,
    /// The credential chain and the region, from the SDK's default chains.
    sdk: tokio::sync::OnceCell<(SharedCredentialsProvider, String)>,
    /// Credentials with an expiry, kept until [`CREDENTIALS_MARGIN`] before it.
    credentials: Mutex<Option<Credentials>>,
}

impl AwsCredentials {
    /// The chain for `[section] auth = "aws_iam"` and `region` (`None`: the SDK's region chain), loaded at
    /// the first [`Self::credentials`].
    pub fn new(section: &'static str, region: Option<String>) -> Self {
        AwsCredentials { section, region, sdk: tokio::sync::OnceCell::new(), credentials: Mutex::new(None) }
    }

    /// Credentials to sign with, and the region.
    ///
    /// # Errors
    /// Definite when no region is known; transient when the chain gave no credentials.
    pub async fn credentials(&self) -> Result<(Credentials, String)> {
        let (provider, region) = self.sdk.get_or_try_init(|| load_sdk(self.section, self.region.clone())).await?;
        let fresh = |c: &Credentials| c.expiry().is_some_and(|at| at > SystemTime::now() + CREDENTIALS_MARGIN);
        if let Some(kept) = self.credentials.lock().unwrap_or_else(|e| e.into_inner()).clone().filter(fresh) {
            return Ok((kept, region.clone()));
        }
        let credentials = provider.provide_credentials().await.map_err(|e| {
            Error::transient(format!(
                "{}.auth = \"aws_iam\": the AWS SDK's default credential chain (environment, profile, web \
                 identity token, EKS Pod Identity, ECS, instance profile) gave no credentials: {}",
                self.section,
                aws_error_chain(&e)
            ))
        })?;
        *self.credentials.lock().unwrap_or_else(|e| e.into_inner()) = Some(credentials.clone());
        Ok((credentials, region.clone()))
    }
}

/// The error and its sources, as the SDK's errors put the reason in a source.
fn aws_error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// The SDK's default credential chain and region chain, with its HTTP client (for STS, the container and
/// instance metadata) on rustls + ring, the TLS stack the connector already links.
async fn load_sdk(section: &str, region: Option<String>) -> Result<(SharedCredentialsProvider, String)> {
    use aws_smithy_http_client::tls;
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https();
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http);
    if let Some(region) = region {
        loader = loader.region(aws_config::Region::new(region));
    }
    let sdk = loader.load().await;
    let region = sdk.region().map(ToString::to_string).ok_or_else(|| {
        Error::definite(format!(
            "{section}.auth = \"aws_iam\" signs its tokens for a region, and none is known: set \
             {section}.aws_region (or AWS_REGION)"
        ))
    })?;
    let provider = sdk.credentials_provider().ok_or_else(|| {
        Error::definite(format!("{section}.auth = \"aws_iam\": the AWS SDK configured no credential provider"))
    })?;
    Ok((provider, region))
}

/// An RDS IAM auth token: `host:port/?Action=connect&DBUser=user&X-Amz-…` presigned for `rds-db` in
/// `region` at `at`, valid for [`RDS_TOKEN_LIFETIME`]; what `aws rds generate-db-auth-token` prints.
///
/// # Errors
/// Definite when the request cannot be signed (a host that cannot be a URL's).
pub fn rds_auth_token(
    credentials: &Credentials,
    region: &str,
    host: &str,
    port: u16,
    user: &str,
    at: SystemTime,
) -> Result<Secret> {
    let request = Presign {
        credentials,
        region,
        service: RDS_SERVICE,
        authority: &format!("{host}:{port}"),
        query: &[("Action", "connect"), ("DBUser", user)],
        expires_in: RDS_TOKEN_LIFETIME,
        at,
    };
    presign(&request)
        .map(Secret::new)
        .map_err(|e| Error::definite(format!("auth = \"aws_iam\": signing the token for {host}:{port} failed: {e}")))
}

/// A `GET https://{authority}/?{query}` to presign with SigV4 (the signature in the query).
pub struct Presign<'a> {
    /// Who signs.
    pub credentials: &'a Credentials,
    /// The region signed for.
    pub region: &'a str,
    /// The service signed for.
    pub service: &'a str,
    /// `host` or `host:port`: the `Host` header signed, and the start of the result.
    pub authority: &'a str,
    /// The request's own query parameters, unencoded.
    pub query: &'a [(&'a str, &'a str)],
    /// `X-Amz-Expires`.
    pub expires_in: Duration,
    /// `X-Amz-Date`.
    pub at: SystemTime,
}

/// The presigned request as `{authority}/?{query}` (no scheme): the request's parameters, then the
/// signature's (`X-Amz-Algorithm`, `-Credential`, `-Date`, `-Expires`, `-SignedHeaders`, a session token's
/// `-Security-Token`, `-Signature`).
///
/// # Errors
/// The signer's, as text (it never holds the secret key).
pub fn presign(request: &Presign<'_>) -> std::result::Result<String, String> {
    use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SignatureLocation, SigningSettings};
    let query: Vec<String> =
        request.query.iter().map(|(k, v)| format!("{}={}", encode_path(k), encode_path(v))).collect();
    let query = query.join("&");
    let url = format!("https://{}/?{query}", request.authority);
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(request.expires_in);
    let identity = request.credentials.clone().into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(request.region)
        .name(request.service)
        .time(request.at)
        .settings(settings)
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let headers = [("host", request.authority)];
    let signable =
        SignableRequest::new("GET", url, headers.into_iter(), SignableBody::Bytes(&[])).map_err(|e| e.to_string())?;
    let (instructions, _signature) = sign(signable, &params).map_err(|e| e.to_string())?.into_parts();
    let mut pairs: Vec<String> = if query.is_empty() { Vec::new() } else { vec![query] };
    pairs.extend(instructions.params().iter().map(|(name, value)| format!("{name}={}", encode_path(value))));
    Ok(format!("{}/?{}", request.authority, pairs.join("&")))
}

/// `auth = "gcp_iam"` or `"azure_ad"`: an access token from a file or a metadata endpoint.
struct AccessToken {
    cloud: TokenCloud,
    from: TokenFrom,
    /// The endpoint's last token and when to stop using it.
    cached: Mutex<Option<(Secret, Instant)>>,
}

impl AccessToken {
    /// A token, and where it came from (for messages).
    async fn get(&self) -> Result<(Secret, String)> {
        match &self.from {
            TokenFrom::File(path) => {
                let token = crate::secret::read_file(path).map_err(|e| {
                    Error::definite(format!("source.token_file names the file {}, but {e}", path.display()))
                })?;
                Ok((token, format!("token file {}", path.display())))
            }
            TokenFrom::Endpoint(url) => {
                let from = format!("metadata endpoint {}", url.split('?').next().unwrap_or(url));
                let kept = self.cached.lock().unwrap_or_else(|e| e.into_inner()).clone();
                if let Some((token, _)) = kept.filter(|(_, until)| *until > Instant::now()) {
                    return Ok((token, from));
                }
                let (url, header) = (url.clone(), self.cloud.header());
                let (token, expires_in) = tokio::task::spawn_blocking(move || fetch_token(&url, header))
                    .await
                    .map_err(|e| Error::transient(format!("the token request's thread failed: {e}")))??;
                let until = Instant::now() + expires_in.saturating_sub(TOKEN_MARGIN);
                *self.cached.lock().unwrap_or_else(|e| e.into_inner()) = Some((token.clone(), until));
                Ok((token, from))
            }
        }
    }
}

/// Asks a metadata endpoint for an access token: `{"access_token": "…", "expires_in": 3599, …}` (Azure
/// writes `expires_in` as a string).
fn fetch_token(url: &str, (name, value): (&str, &str)) -> Result<(Secret, Duration)> {
    let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(ENDPOINT_TIMEOUT)).build().into();
    let base = url.split('?').next().unwrap_or(url);
    let mut response = agent.get(url).header(name, value).call().map_err(|e| match e {
        ureq::Error::StatusCode(code) if (400..500).contains(&code) && code != 429 => Error::definite(format!(
            "the metadata endpoint {base} refused the token request with HTTP {code}: does this machine or pod \
             have a cloud identity (a service account bound to it)?"
        )),
        e => Error::transient(format!("asking the metadata endpoint {base} for a token: {e}")),
    })?;
    let body: serde_json::Value = response
        .body_mut()
        .read_json()
        .map_err(|e| Error::transient(format!("the metadata endpoint {base} answered no token JSON: {e}")))?;
    let token = body.get("access_token").and_then(|t| t.as_str()).filter(|t| !t.is_empty());
    let expires_in = match body.get("expires_in") {
        Some(serde_json::Value::Number(n)) => n.as_u64(),
        Some(serde_json::Value::String(s)) => s.parse().ok(),
        _ => None,
    };
    match (token, expires_in) {
        (Some(token), Some(seconds)) => Ok((Secret::new(token), Duration::from_secs(seconds))),
        _ => {
            Err(Error::transient(format!("the metadata endpoint {base} answered without access_token and expires_in")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published SigV4 test suite's credentials, time, region and service.
    fn vector_credentials() -> Credentials {
        Credentials::new("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None, None, "test")
    }

    fn vector_time() -> SystemTime {
        // 2015-08-30T12:36:00Z
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_440_938_160)
    }

    /// The presigned (query) variants of AWS's SigV4 test vectors `get-vanilla` and
    /// `get-vanilla-query-order-key-case`: the signature in `query-signature.txt`, and the signing parameters
    /// of `query-signed-request.txt`. Guards the settings we sign RDS tokens with (query location, the host
    /// header, the empty body's hash, parameter order in the canonical query).
    #[test]
    fn presigning_matches_the_sigv4_test_suite() {
        let credentials = vector_credentials();
        /// (the vector's name, the request's own query, its `query-signature.txt`)
        type Vector<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: [Vector; 2] = [
            ("get-vanilla", &[], "e93c787ed7f371d5c6b165c1b38ede9550f4dce4144713e844b25b7192d3865d"),
            (
                "get-vanilla-query-order-key-case",
                &[("Param2", "value2"), ("Param1", "value1")],
                "86012e2c9ad4d77369f5d81c11f75158aae4f895a085212cc6d3f923d300bed5",
            ),
        ];
        for (name, query, signature) in cases {
            let request = Presign {
                credentials: &credentials,
                region: "us-east-1",
                service: "service",
                authority: "example.amazonaws.com",
                query,
                expires_in: Duration::from_secs(3600),
                at: vector_time(),
            };
            let signed = presign(&request).unwrap();
            let (authority, rest) = signed.split_once("/?").unwrap();
            assert_eq!(authority, "example.amazonaws.com", "{name}");
            let params: Vec<(&str, &str)> = rest.split('&').map(|p| p.split_once('=').unwrap()).collect();
            let get = |key: &str| params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
            assert_eq!(get("X-Amz-Signature"), Some(signature), "{name}: {signed}");
            assert_eq!(get("X-Amz-Algorithm"), Some("AWS4-HMAC-SHA256"), "{name}");
            assert_eq!(get("X-Amz-Credential"), Some("AKIDEXAMPLE%2F20150830%2Fus-east-1%2Fservice%2Faws4_request"));
            assert_eq!(get("X-Amz-Date"), Some("20150830T123600Z"), "{name}");
            assert_eq!(get("X-Amz-Expires"), Some("3600"), "{name}");
            assert_eq!(get("X-Amz-SignedHeaders"), Some("host"), "{name}");
            for (k, v) in query {
                assert_eq!(get(k), Some(*v), "{name}: the request's own parameter {k}");
            }
        }
    }

    /// The RDS token's fields, one by one: the endpoint with its port, `Action=connect`, the user
    /// percent-encoded, the credential scope of `rds-db` in the region, 900 seconds, `host` the only signed
    /// header, a session token carried, and no scheme.
    #[test]
    fn rds_token_has_the_fields_rds_reads() {
        let credentials =
            Credentials::new("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None, None, "test");
        let at = vector_time();
        let token = rds_auth_token(&credentials, "eu-west-1", "db.example.com", 3306, "cdc+iam", at).unwrap();
        let token = token.expose();
        assert!(token.starts_with("db.example.com:3306/?Action=connect&DBUser=cdc%2Biam&"), "{token}");
        assert!(!token.contains("://"), "{token}");
        let params: Vec<(&str, &str)> =
            token.split_once("/?").unwrap().1.split('&').map(|p| p.split_once('=').unwrap()).collect();
        let get = |key: &str| params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        assert_eq!(get("X-Amz-Credential"), Some("AKIDEXAMPLE%2F20150830%2Feu-west-1%2Frds-db%2Faws4_request"));
        assert_eq!(get("X-Amz-Date"), Some("20150830T123600Z"));
        assert_eq!(get("X-Amz-Expires"), Some("900"));
        assert_eq!(get("X-Amz-SignedHeaders"), Some("host"));
        assert_eq!(get("X-Amz-Signature").map(str::len), Some(64));
        assert_eq!(get("X-Amz-Security-Token"), None);

        let session = Credentials::new("ASIAEXAMPLE", "secret", Some("tok+en/=".to_string()), None, "test");
        let token = rds_auth_token(&session, "eu-west-1", "db.example.com", 3306, "cdc", at).unwrap();
        assert!(token.expose().contains("&X-Amz-Security-Token=tok%2Ben%2F%3D"), "{}", token.expose());
    }
}
