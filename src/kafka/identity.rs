//! Who the connector is to the Kafka cluster with `[kafka] auth = "aws_iam"` (Amazon MSK's IAM access
//! control): the SASL/OAUTHBEARER token of every librdkafka client the connector makes, a SigV4-presigned
//! `kafka-cluster:Connect` request signed with the AWS SDK's default credential chain, as AWS's MSK signer
//! libraries make it.
//!
//! Floor 3 (docs/ARCHITECTURE.md): imports floors 0-2, and `source::identity` beside it (the credential
//! chain and the SigV4 presigning the RDS tokens use).
//!
//! # Invariants
//! - Every client the connector makes goes through [`create`] with a context that holds [`Tokens`] (ours, or
//!   [`Context`] where librdkafka's default one would do): [`create`] gives it its first token before it
//!   returns it. A token otherwise reaches a client only through a poll of its main queue, and several clients
//!   block before anything polls them there (an admin client never does, rust-rdkafka #757; `init_transactions`
//!   and metadata reads come first), so they would wait for a token until they time out. An admin client that
//!   lives long would also miss every later token: the connector's live only for what they are made for.
//! - After that, librdkafka asks the context for the next token 80% through the current one's life, from the
//!   client's poll: the producer's thread, the readers' polls. A token's life ends at the earlier of its
//!   signature's 15 minutes and the credentials' expiry, so the next one is made while both still hold; and
//!   librdkafka re-authenticates each connection with the current token before the session the broker gave it
//!   ends (KIP-368, which MSK uses), so a connection that lives for days is never left with a dead token.
//! - A token never reaches a log or a message: it travels as a [`Secret`]; messages name the identity (the
//!   access key id's last four characters and the region).
//! - Without `aws_iam` a context asked for a token (OAUTHBEARER configured without `sasl.oauthbearer.method =
//!   "oidc"`) answers with an error that says what to configure, which librdkafka logs, instead of the
//!   silent wait for a token that no one makes.
//!
//! # Why a thread of its own
//! librdkafka asks for tokens from whatever thread polls the client, never from an async context, and the SDK's
//! credential providers are async and keep connection pools bound to the runtime they first ran on. So one
//! thread per region, with a runtime of its own, keeps the credential chain and signs every token of the process.

use std::ffi::{c_char, CStr, CString};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use base64::Engine as _;
use rdkafka::admin::AdminClient;
use rdkafka::client::{Client, OAuthToken};
use rdkafka::config::{ClientConfig, FromClientConfigAndContext};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::producer::{BaseProducer, DeliveryResult, Partitioner, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use crate::config::{KafkaAuth, KafkaConfig};
use crate::error::{classify_kafka, Error, Result};
use crate::schema::registry::encode_path;
use crate::secret::Secret;
use crate::source::identity::{presign, AwsCredentials, Presign};

/// How long an MSK IAM token's signature is valid (`X-Amz-Expires`, as AWS's signers set it).
pub const MSK_TOKEN_LIFETIME: Duration = Duration::from_secs(900);
/// The SigV4 service name of MSK's IAM access control.
const MSK_SERVICE: &str = "kafka-cluster";
/// How long a client waits for a token (the credential chain's network calls included).
const TOKEN_TIMEOUT: Duration = Duration::from_secs(30);

/// An MSK IAM token, and until when librdkafka may use it.
pub struct MskToken {
    /// The base64url (unpadded) presigned URL: the OAUTHBEARER token.
    pub token: Secret,
    /// The earlier of the signature's end and the credentials' expiry.
    pub expires: SystemTime,
    /// Who it authenticates, for messages: never the secret.
    pub who: String,
}

/// The token MSK's IAM access control takes: `https://kafka.<region>.amazonaws.com/?Action=kafka-cluster%3A
/// Connect&X-Amz-…` presigned for `kafka-cluster` in `region` at `at` for [`MSK_TOKEN_LIFETIME`], with a
/// `User-Agent` parameter after the signature, base64url-encoded without padding.
///
/// # Errors
/// Definite when the request cannot be signed.
pub fn msk_auth_token(credentials: &Credentials, region: &str, at: SystemTime) -> Result<MskToken> {
    let authority = format!("kafka.{region}.amazonaws.com");
    let request = Presign {
        credentials,
        region,
        service: MSK_SERVICE,
        authority: &authority,
        query: &[("Action", "kafka-cluster:Connect")],
        expires_in: MSK_TOKEN_LIFETIME,
        at,
    };
    let presigned = presign(&request).map_err(|e| {
        Error::definite(format!("kafka.auth = \"aws_iam\": signing the MSK token for region {region} failed: {e}"))
    })?;
    let agent = encode_path(concat!("outbox-cdc/", env!("CARGO_PKG_VERSION")));
    let url = format!("https://{presigned}&User-Agent={agent}");
    // X-Amz-Date has whole seconds: the signature ends 900 s after the signed second.
    let signed = at.duration_since(UNIX_EPOCH).map(|d| UNIX_EPOCH + Duration::from_secs(d.as_secs())).unwrap_or(at);
    let mut expires = signed + MSK_TOKEN_LIFETIME;
    if let Some(end) = credentials.expiry() {
        expires = expires.min(end);
    }
    let key = credentials.access_key_id();
    let tail = &key[key.len().saturating_sub(4)..];
    Ok(MskToken {
        token: Secret::new(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(url)),
        expires,
        who: format!("kafka.auth = \"aws_iam\" (access key id ...{tail}, region {region})"),
    })
}

/// The tokens of a client: none (`auth = "properties"`), or the process's signer for the config's region.
/// Clones share the signer.
#[derive(Clone, Default)]
pub struct Tokens(Option<Arc<Signer>>);

/// The signers of this process, one per `kafka.aws_region`: every client shares its config's.
static SIGNERS: Mutex<Vec<(Option<String>, Arc<Signer>)>> = Mutex::new(Vec::new());

impl Tokens {
    /// The tokens `config` asks for.
    ///
    /// # Errors
    /// Transient when the signer's thread cannot be started.
    pub fn of(config: &KafkaConfig) -> Result<Tokens> {
        if config.auth != KafkaAuth::AwsIam {
            return Ok(Tokens(None));
        }
        let mut signers = SIGNERS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, signer)) = signers.iter().find(|(region, _)| *region == config.aws_region) {
            return Ok(Tokens(Some(signer.clone())));
        }
        let signer = Arc::new(Signer::start(config.aws_region.clone())?);
        signers.push((config.aws_region.clone(), signer.clone()));
        Ok(Tokens(Some(signer)))
    }

    /// Who the last token was made for ([`MskToken::who`]); `None` without `aws_iam` or before the first.
    pub fn last_who(&self) -> Option<String> {
        self.0.as_ref().and_then(|signer| signer.last.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// What to check when the cluster refuses this identity; `None` without `aws_iam`.
    pub fn denied_hint(&self) -> Option<String> {
        let who = self.0.as_ref()?.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Some(format!(
            "The cluster refused the MSK IAM token{}. Likely causes: the role's IAM policy lacks \
             kafka-cluster:Connect on arn:aws:kafka:<region>:<account>:cluster/<cluster name>/*; the token was \
             signed for another region than the cluster's (kafka.aws_region); kafka.bootstrap_servers is not the \
             cluster's IAM listener (port 9098); IAM access control is not enabled on the cluster; the machine's \
             clock is off by more than a few minutes. See the README's Kafka authentication",
            who.map(|w| format!(" of {w}")).unwrap_or_default()
        ))
    }

    /// A token for librdkafka's `OAUTHBEARER` refresh ([`ClientContext::generate_oauth_token`]).
    ///
    /// # Errors
    /// When no token is configured, or none could be made: librdkafka logs it and asks again in 10 s.
    pub fn generate(&self) -> std::result::Result<OAuthToken, Box<dyn std::error::Error>> {
        let Some(signer) = &self.0 else {
            return Err("sasl.mechanism = OAUTHBEARER asks the connector for a token, and it has none to give: set \
                        kafka.auth = \"aws_iam\" (Amazon MSK), or sasl.oauthbearer.method = \"oidc\" with its \
                        token endpoint in [kafka.properties]"
                .into());
        };
        match signer.token() {
            Ok(token) => {
                tracing::debug!(who = %token.who, "a new MSK IAM token for a Kafka client");
                Ok(OAuthToken {
                    token: token.token.expose().to_string(),
                    principal_name: token.who,
                    lifetime_ms: epoch_ms(token.expires),
                })
            }
            Err(e) => {
                tracing::warn!("kafka.auth = \"aws_iam\": no token for a Kafka client ({e}); librdkafka asks again");
                Err(e.to_string().into())
            }
        }
    }
}

/// Milliseconds since the epoch, librdkafka's token lifetime.
fn epoch_ms(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)).unwrap_or(0)
}

/// A reply channel for one token.
type Reply = mpsc::SyncSender<Result<MskToken>>;

/// The thread that keeps one region's credential chain and signs its tokens (module doc).
struct Signer {
    requests: mpsc::Sender<Reply>,
    /// [`MskToken::who`] of the last token made, for `outbox-cdc check`.
    last: Mutex<Option<String>>,
}

impl Signer {
    fn start(region: Option<String>) -> Result<Signer> {
        let (requests, incoming) = mpsc::channel::<Reply>();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| {
            Error::transient(format!("kafka.auth = \"aws_iam\": the token signer's runtime could not start: {e}"))
        })?;
        std::thread::Builder::new()
            .name("msk-iam-signer".into())
            .spawn(move || {
                let credentials = AwsCredentials::new("kafka", region);
                for reply in incoming {
                    let token = runtime
                        .block_on(credentials.credentials())
                        .and_then(|(credentials, region)| msk_auth_token(&credentials, &region, SystemTime::now()));
                    // The asker may have given up waiting.
                    let _ = reply.send(token);
                }
            })
            .map_err(|e| {
                Error::transient(format!("kafka.auth = \"aws_iam\": the token signer's thread could not start: {e}"))
            })?;
        Ok(Signer { requests, last: Mutex::new(None) })
    }

    /// A token made now.
    fn token(&self) -> Result<MskToken> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.requests
            .send(reply)
            .map_err(|_| Error::transient("kafka.auth = \"aws_iam\": the token signer's thread has stopped"))?;
        let token = answer.recv_timeout(TOKEN_TIMEOUT).map_err(|_| {
            Error::transient(format!(
                "kafka.auth = \"aws_iam\": no token within {}s (the AWS SDK's credential chain did not answer)",
                TOKEN_TIMEOUT.as_secs()
            ))
        })??;
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(token.who.clone());
        Ok(token)
    }
}

/// A context that holds a client's [`Tokens`].
pub trait Tokened {
    /// The client's tokens.
    fn tokens(&self) -> &Tokens;
}

/// The context of a client that needs nothing from librdkafka's callbacks but its tokens: librdkafka's
/// default logging and error reports, and a producer's deliveries ignored.
#[derive(Clone, Default)]
pub struct Context {
    tokens: Tokens,
}

impl Context {
    /// A context with `tokens`.
    pub fn new(tokens: Tokens) -> Self {
        Context { tokens }
    }

    /// A context with the tokens `config` asks for.
    ///
    /// # Errors
    /// As [`Tokens::of`].
    pub fn of(config: &KafkaConfig) -> Result<Self> {
        Ok(Context { tokens: Tokens::of(config)? })
    }
}

impl Tokened for Context {
    fn tokens(&self) -> &Tokens {
        &self.tokens
    }
}

impl ClientContext for Context {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(
        &self,
        _config: Option<&str>,
    ) -> std::result::Result<OAuthToken, Box<dyn std::error::Error>> {
        self.tokens.generate()
    }
}

impl ConsumerContext for Context {}

impl ProducerContext for Context {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// A librdkafka client of any kind, for [`create`] to reach its handle.
pub trait Made<C: ClientContext> {
    /// The client underneath.
    fn made(&self) -> &Client<C>;
}

impl<C: ClientContext> Made<C> for AdminClient<C> {
    fn made(&self) -> &Client<C> {
        self.inner()
    }
}

impl<C: ConsumerContext> Made<C> for BaseConsumer<C> {
    fn made(&self) -> &Client<C> {
        self.client()
    }
}

impl<C: ProducerContext<P>, P: Partitioner> Made<C> for BaseProducer<C, P> {
    fn made(&self) -> &Client<C> {
        self.client()
    }
}

impl<C: ProducerContext<P> + 'static, P: Partitioner + Send + Sync + 'static> Made<C> for ThreadedProducer<C, P> {
    fn made(&self) -> &Client<C> {
        self.client()
    }
}

/// A client made from `cc` with `context`, holding its first token when its context has any (module doc).
///
/// # Errors
/// Definite when librdkafka refuses the configuration or the token; transient when no token could be made.
pub fn create<T, C>(cc: &ClientConfig, context: C) -> Result<T>
where
    T: FromClientConfigAndContext<C> + Made<C>,
    C: ClientContext + Tokened,
{
    let tokens = context.tokens().clone();
    let client: T = cc.create_with_context(context).map_err(|e| classify_kafka(&e))?;
    prime(client.made(), &tokens)?;
    Ok(client)
}

/// A client made from `cc` with a [`Context`] holding the tokens `config` asks for ([`create`]).
///
/// # Errors
/// As [`create`].
pub fn client<T>(config: &KafkaConfig, cc: &ClientConfig) -> Result<T>
where
    T: FromClientConfigAndContext<Context> + Made<Context>,
{
    create(cc, Context::of(config)?)
}

/// Hands `client` a token now, when `tokens` has a signer.
fn prime<C: ClientContext>(client: &Client<C>, tokens: &Tokens) -> Result<()> {
    let Some(signer) = &tokens.0 else { return Ok(()) };
    let token = signer.token()?;
    let internal = |what: &str| Error::definite(format!("kafka.auth = \"aws_iam\": the {what} holds a NUL byte"));
    let value = CString::new(token.token.expose()).map_err(|_| internal("token"))?;
    let principal = CString::new(token.who.as_str()).map_err(|_| internal("principal"))?;
    let mut errstr = [0 as c_char; 512];
    // SAFETY: the client handle is alive for the borrow; the strings outlive the call, which copies them;
    // no extensions are passed (null, 0); errstr is writable for its length.
    let code = unsafe {
        rdkafka::bindings::rd_kafka_oauthbearer_set_token(
            client.native_ptr(),
            value.as_ptr(),
            epoch_ms(token.expires),
            principal.as_ptr(),
            std::ptr::null_mut(),
            0,
            errstr.as_mut_ptr(),
            errstr.len(),
        )
    };
    if code == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Ok(());
    }
    // SAFETY: librdkafka wrote a NUL-terminated message into errstr (zeroed before the call).
    let reason = unsafe { CStr::from_ptr(errstr.as_ptr()) }.to_string_lossy().into_owned();
    Err(Error::definite(format!("librdkafka refused the MSK IAM token of {}: {reason}", token.who)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The token decodes to the presigned URL AWS's MSK signers make (scheme, host, `Action` first, the
    /// SigV4 query parameters, then `User-Agent`), and its life ends at the earlier of the signature's 15
    /// minutes and the credentials' expiry. (tests/msk_iam.rs compares it with AWS's Python signer.)
    #[test]
    fn msk_token_is_a_presigned_connect_url() {
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000) + Duration::from_millis(700);
        let credentials = Credentials::new("AKIDEXAMPLE1234", "secret", Some("session".into()), None, "test");
        let token = msk_auth_token(&credentials, "eu-west-1", at).unwrap();
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token.token.expose()).unwrap();
        let url = String::from_utf8(url).unwrap();
        assert!(url.starts_with("https://kafka.eu-west-1.amazonaws.com/?Action=kafka-cluster%3AConnect&"), "{url}");
        for part in [
            "X-Amz-Algorithm=AWS4-HMAC-SHA256",
            "X-Amz-Credential=AKIDEXAMPLE1234%2F20231114%2Feu-west-1%2Fkafka-cluster%2Faws4_request",
            "X-Amz-Date=20231114T221320Z",
            "X-Amz-Expires=900",
            "X-Amz-SignedHeaders=host",
            "X-Amz-Security-Token=session",
        ] {
            assert!(url.contains(&format!("&{part}&")), "{part} missing in {url}");
        }
        assert!(url.ends_with(concat!("&User-Agent=outbox-cdc%2F", env!("CARGO_PKG_VERSION"))), "{url}");
        assert_eq!(token.expires, UNIX_EPOCH + Duration::from_secs(1_700_000_000 + 900));
        assert!(token.who.contains("...1234") && !token.who.contains("secret"), "{}", token.who);

        let ending = UNIX_EPOCH + Duration::from_secs(1_700_000_060);
        let short = Credentials::new("AKIDEXAMPLE1234", "secret", None, Some(ending), "test");
        assert_eq!(msk_auth_token(&short, "eu-west-1", at).unwrap().expires, ending);
    }

    /// Regression guard for the silent wait: a client asked for a token without `aws_iam` gets an error
    /// that says what to configure.
    #[test]
    fn no_token_without_aws_iam_says_what_to_set() {
        let error = Tokens::default().generate().err().expect("no token without aws_iam").to_string();
        assert!(error.contains("kafka.auth = \"aws_iam\"") && error.contains("oidc"), "{error}");
    }
}
