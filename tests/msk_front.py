"""An Amazon MSK IAM listener in front of a Kafka broker, for tests/msk_iam.rs: SASL_SSL with OAUTHBEARER,
each token checked the way MSK checks it, by botocore (the AWS SDK for Python) recomputing its SigV4
signature, and the short-lived AWS credentials the connector signs with, served as ECS's container
credential endpoint does.

Usage: msk_front.py CONFIG_JSON, with keys kafka_port, upstream_port, credentials_port, cert, key, region,
credentials_lifetime_s, log. Prints "ready" once both ports listen; runs until killed.

What it does, as a real MSK IAM listener does:
- Every connection is TLS. Before authenticating, only ApiVersions (whose answer, from the broker behind,
  gets SaslHandshake and SaslAuthenticate added) and the SASL exchange are served; any other request closes
  the connection.
- SaslHandshake takes OAUTHBEARER only. SaslAuthenticate takes `n,,\\x01auth=Bearer <token>\\x01\\x01`. The
  token must be the base64url presigned `kafka-cluster:Connect` URL of credentials this process issued and
  that have not expired, signed less than X-Amz-Expires ago; its signature must equal the one botocore
  computes for the same request at the signed time.
- The session lasts until the token or its credentials expire, whichever is first; SaslAuthenticate v1 says
  how long (KIP-368), and a request after the session ended closes the connection. The client must
  re-authenticate on the open connection with a newer token before then.
- The credential endpoint (`GET /creds`) issues a new key every call, valid for credentials_lifetime_s.

Every issue, authentication and refusal is a JSON line in the log, for the test to judge.
"""

import asyncio
import base64
import datetime
import json
import secrets
import ssl
import string
import struct
import sys
import threading
import time
from urllib.parse import parse_qsl, urlparse

import botocore.auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

API_SASL_HANDSHAKE = 17
API_VERSIONS = 18
API_SASL_AUTHENTICATE = 36
UNSUPPORTED_SASL_MECHANISM = 33
SASL_AUTHENTICATION_FAILED = 58


class Front:
    def __init__(self, config):
        self.config = config
        self.region = config["region"]
        self.lifetime = float(config["credentials_lifetime_s"])
        self.issued = {}  # access key id -> (secret, session token, expiry epoch s)
        self.log_file = open(config["log"], "a", buffering=1)
        self.connections = 0
        self.sign_lock = threading.Lock()

    def log(self, **event):
        event["t"] = round(time.time(), 3)
        self.log_file.write(json.dumps(event, sort_keys=True) + "\n")

    # --- the credential endpoint ----------------------------------------------------------------

    def issue(self):
        key = "ASIA" + "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(16))
        secret = secrets.token_urlsafe(30)
        token = secrets.token_urlsafe(60)
        expiry = time.time() + self.lifetime
        self.issued[key] = (secret, token, expiry)
        # The secrets too (they are a test's), so that the test can look for them in the connector's logs.
        self.log(event="issued", key=key, expires=expiry, secret=secret, session_token=token)
        stamp = datetime.datetime.fromtimestamp(expiry, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"AccessKeyId": key, "SecretAccessKey": secret, "Token": token, "Expiration": stamp,
                "RoleArn": "arn:aws:iam::111122223333:role/outbox-cdc-test"}

    async def serve_credentials(self, reader, writer):
        try:
            request = await reader.readuntil(b"\r\n\r\n")
            line = request.split(b"\r\n", 1)[0].decode()
            if line.startswith("GET /creds "):
                body = json.dumps(self.issue()).encode()
                status = "200 OK"
            else:
                body = b"{}"
                status = "404 Not Found"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    # --- checking a token -----------------------------------------------------------------------

    def check_token(self, token):
        """(key id, session end epoch s) of a valid token; raises ValueError saying why one is not."""
        url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        parsed = urlparse(url)
        host = f"kafka.{self.region}.amazonaws.com"
        if parsed.scheme != "https" or parsed.netloc != host or parsed.path != "/":
            raise ValueError(f"not a presigned request to https://{host}/: {parsed.scheme}://{parsed.netloc}{parsed.path}")
        pairs = parse_qsl(parsed.query, keep_blank_values=True, strict_parsing=True)
        query = dict(pairs)
        if len(query) != len(pairs):
            raise ValueError("a query parameter is repeated")
        if query.get("Action") != "kafka-cluster:Connect":
            raise ValueError(f"Action is {query.get('Action')!r}")
        if query.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256" or query.get("X-Amz-SignedHeaders") != "host":
            raise ValueError("not a SigV4 query signature over the host header")
        key, day, region, service, terminator = query["X-Amz-Credential"].split("/")
        if region != self.region or service != "kafka-cluster" or terminator != "aws4_request":
            raise ValueError(f"signed for {region}/{service}")
        if key not in self.issued:
            raise ValueError(f"access key {key} was never issued")
        secret, session_token, credentials_expiry = self.issued[key]
        if query.get("X-Amz-Security-Token") != session_token:
            raise ValueError("the session token is not the one issued with the key")
        signed = datetime.datetime.strptime(query["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
        if signed.strftime("%Y%m%d") != day:
            raise ValueError("the credential scope's day is not the signing day")
        expires = int(query["X-Amz-Expires"])
        now = time.time()
        if not 0 < expires <= 900:
            raise ValueError(f"X-Amz-Expires = {expires}")
        if signed.timestamp() > now + 300:
            raise ValueError("signed in the future")
        if now > signed.timestamp() + expires:
            raise ValueError(f"the signature expired {now - signed.timestamp() - expires:.1f}s ago")
        if now > credentials_expiry:
            raise ValueError(f"its credentials expired {now - credentials_expiry:.1f}s ago")
        expected = self.botocore_signature(key, secret, session_token, signed, expires)
        if expected != query["X-Amz-Signature"]:
            raise ValueError("the signature is not the one botocore computes for the request")
        return key, min(signed.timestamp() + expires, credentials_expiry)

    def botocore_signature(self, key, secret, session_token, signed, expires):
        with self.sign_lock:
            saved = botocore.auth.get_current_datetime
            botocore.auth.get_current_datetime = lambda remove_tzinfo=True: (
                signed.replace(tzinfo=None) if remove_tzinfo else signed)
            try:
                request = AWSRequest(method="GET", url=f"https://kafka.{self.region}.amazonaws.com/",
                                     params={"Action": "kafka-cluster:Connect"})
                auth = botocore.auth.SigV4QueryAuth(Credentials(key, secret, session_token), "kafka-cluster",
                                                    self.region, expires=expires)
                auth.add_auth(request)
            finally:
                botocore.auth.get_current_datetime = saved
        return dict(parse_qsl(urlparse(request.url).query))["X-Amz-Signature"]

    # --- the Kafka listener ---------------------------------------------------------------------

    async def serve_kafka(self, client_reader, client_writer):
        self.connections += 1
        conn = self.connections
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.config["upstream_port"])
        except OSError as e:
            self.log(event="upstream_refused", conn=conn, error=str(e))
            client_writer.close()
            return
        state = {"session_end": None, "auths": 0, "rewrite": {}}
        lock = asyncio.Lock()
        relay = asyncio.ensure_future(self.relay_responses(conn, up_reader, client_writer, lock, state))
        try:
            while True:
                frame = await read_frame(client_reader)
                if frame is None:
                    return
                api_key, api_version, corr = struct.unpack(">hhi", frame[:8])
                (client_len,) = struct.unpack(">h", frame[8:10])
                client_id = frame[10:10 + client_len].decode() if client_len >= 0 else None
                body = frame[10 + max(client_len, 0):]
                if api_key == API_SASL_HANDSHAKE:
                    answer = self.handshake(body)
                elif api_key == API_SASL_AUTHENTICATE:
                    answer = self.authenticate(conn, client_id, api_version, body, state)
                elif api_key == API_VERSIONS:
                    state["rewrite"][corr] = api_version
                    up_writer.write(struct.pack(">i", len(frame)) + frame)
                    await up_writer.drain()
                    continue
                elif state["session_end"] is None:
                    self.log(event="unauthenticated_request", conn=conn, client_id=client_id, api_key=api_key)
                    return
                elif time.time() > state["session_end"]:
                    self.log(event="session_expired", conn=conn, client_id=client_id, api_key=api_key,
                             late_s=round(time.time() - state["session_end"], 3))
                    return
                else:
                    up_writer.write(struct.pack(">i", len(frame)) + frame)
                    await up_writer.drain()
                    continue
                if answer is None:
                    return
                async with lock:
                    response = struct.pack(">i", corr) + answer
                    client_writer.write(struct.pack(">i", len(response)) + response)
                    await client_writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            relay.cancel()
            up_writer.close()
            client_writer.close()

    async def relay_responses(self, conn, up_reader, client_writer, lock, state):
        try:
            while True:
                frame = await read_frame(up_reader)
                if frame is None:
                    client_writer.close()
                    return
                (corr,) = struct.unpack(">i", frame[:4])
                version = state["rewrite"].pop(corr, None)
                if version is not None:
                    frame = frame[:4] + with_sasl_apis(frame[4:], version)
                async with lock:
                    client_writer.write(struct.pack(">i", len(frame)) + frame)
                    await client_writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass

    def handshake(self, body):
        (length,) = struct.unpack(">h", body[:2])
        mechanism = body[2:2 + length].decode()
        error = 0 if mechanism == "OAUTHBEARER" else UNSUPPORTED_SASL_MECHANISM
        name = b"OAUTHBEARER"
        return struct.pack(">hih", error, 1, len(name)) + name

    def authenticate(self, conn, client_id, version, body, state):
        if version > 1:
            self.log(event="unsupported", conn=conn, client_id=client_id, api_version=version)
            return None
        (length,) = struct.unpack(">i", body[:4])
        message = body[4:4 + length].decode()
        reauth = state["session_end"] is not None
        try:
            parts = message.split("\x01")
            if not parts[0].startswith("n,"):
                raise ValueError("not an OAUTHBEARER client-first message")
            auth = [p for p in parts[1:] if p.startswith("auth=")]
            if len(auth) != 1 or not auth[0].startswith("auth=Bearer "):
                raise ValueError("no auth=Bearer")
            key, session_end = self.check_token(auth[0][len("auth=Bearer "):])
        except (ValueError, KeyError, UnicodeDecodeError) as e:
            self.log(event="auth", conn=conn, client_id=client_id, ok=False, reauth=reauth, reason=str(e))
            text = f"Access denied: {e}".encode()
            return struct.pack(">hh", SASL_AUTHENTICATION_FAILED, len(text)) + text + struct.pack(">i", 0) + (
                struct.pack(">q", 0) if version >= 1 else b"")
        state["session_end"] = session_end
        state["auths"] += 1
        lifetime_ms = max(int((session_end - time.time()) * 1000), 1)
        self.log(event="auth", conn=conn, client_id=client_id, ok=True, reauth=reauth, key=key,
                 session_ms=lifetime_ms)
        return struct.pack(">hhi", 0, -1, 0) + (struct.pack(">q", lifetime_ms) if version >= 1 else b"")


async def read_frame(reader):
    try:
        (length,) = struct.unpack(">i", await reader.readexactly(4))
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        return None


def read_uvarint(data, at):
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def uvarint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def skip_tags(data, at):
    count, at = read_uvarint(data, at)
    for _ in range(count):
        _, at = read_uvarint(data, at)
        size, at = read_uvarint(data, at)
        at += size
    return at


def with_sasl_apis(body, version):
    """An ApiVersions answer (after its correlation id) with SaslHandshake v0-1 and SaslAuthenticate v0-1."""
    (error,) = struct.unpack(">h", body[:2])
    if error:
        return body
    flexible = version >= 3
    at = 2
    if flexible:
        count, at = read_uvarint(body, at)
        count -= 1
    else:
        (count,) = struct.unpack(">i", body[at:at + 4])
        at += 4
    entries = []
    for _ in range(count):
        start = at
        api_key = struct.unpack(">h", body[at:at + 2])[0]
        at += 6
        if flexible:
            at = skip_tags(body, at)
        if api_key not in (API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE):
            entries.append(body[start:at])
    tag = b"\x00" if flexible else b""
    entries.append(struct.pack(">hhh", API_SASL_HANDSHAKE, 0, 1) + tag)
    entries.append(struct.pack(">hhh", API_SASL_AUTHENTICATE, 0, 1) + tag)
    head = uvarint(len(entries) + 1) if flexible else struct.pack(">i", len(entries))
    return body[:2] + head + b"".join(entries) + body[at:]


async def main():
    config = json.loads(sys.argv[1])
    front = Front(config)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(config["cert"], config["key"])
    kafka = await asyncio.start_server(front.serve_kafka, "127.0.0.1", config["kafka_port"], ssl=tls)
    credentials = await asyncio.start_server(front.serve_credentials, "127.0.0.1", config["credentials_port"])
    print("ready", flush=True)
    async with kafka, credentials:
        await asyncio.gather(kafka.serve_forever(), credentials.serve_forever())


if __name__ == "__main__":
    asyncio.run(main())
