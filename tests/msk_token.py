"""An MSK IAM token made by AWS's MSK signer for Python (`aws-msk-iam-sasl-signer-python`,
`MSKAuthTokenProvider.generate_auth_token_from_credentials_provider`) at a frozen time: the independent
implementation tests/msk_iam.rs compares the connector's tokens with.

Usage: msk_token.py ACCESS_KEY_ID SECRET_ACCESS_KEY SESSION_TOKEN REGION EPOCH_SECONDS (an empty
SESSION_TOKEN for none). Prints the token and its expiry in epoch milliseconds, one per line.
"""

import datetime
import sys

import botocore.auth
from aws_msk_iam_sasl_signer import MSKAuthTokenProvider
from botocore.credentials import CredentialProvider, Credentials


class Given(CredentialProvider):
    METHOD = "given"

    def __init__(self, key_id, secret, session_token):
        super().__init__()
        self.credentials = Credentials(key_id, secret, session_token or None)

    def load(self):
        return self.credentials


def main() -> None:
    key_id, secret, session_token, region, epoch = sys.argv[1:6]
    frozen = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
    # botocore's SigV4 signer asks this function for "now"; the token is a function of it, so freeze it.
    botocore.auth.get_current_datetime = lambda remove_tzinfo=True: (
        frozen.replace(tzinfo=None) if remove_tzinfo else frozen
    )
    token, expiry_ms = MSKAuthTokenProvider.generate_auth_token_from_credentials_provider(
        region, Given(key_id, secret, session_token))
    print(token)
    print(expiry_ms)


if __name__ == "__main__":
    main()
