"""An RDS IAM auth token made by botocore (`RDS.Client.generate_db_auth_token`), the AWS SDK for Python, at a
frozen time: the independent implementation tests/identity.rs compares the connector's tokens with.

Usage: rds_token.py ACCESS_KEY_ID SECRET_ACCESS_KEY SESSION_TOKEN REGION HOST PORT USER EPOCH_SECONDS
(an empty SESSION_TOKEN for none). Prints the token.
"""

import datetime
import sys

import botocore.auth
import botocore.session


def main() -> None:
    key_id, secret, session_token, region, host, port, user, epoch = sys.argv[1:9]
    frozen = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
    # The signer asks this function for "now"; the token is a function of it, so freeze it.
    botocore.auth.get_current_datetime = lambda remove_tzinfo=True: (
        frozen.replace(tzinfo=None) if remove_tzinfo else frozen
    )
    session = botocore.session.get_session()
    session.set_credentials(key_id, secret, session_token or None)
    client = session.create_client("rds", region_name=region)
    print(client.generate_db_auth_token(DBHostname=host, Port=int(port), DBUsername=user, Region=region))


if __name__ == "__main__":
    main()
