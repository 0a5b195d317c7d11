"""Real S3 servers on loopback for the object-store tests: moto's S3 server (in-process,
ThreadedMotoServer) and moto's server as its own process with IAM authentication on
(INITIAL_NO_AUTH_ACTION_COUNT), where an unknown access key and a user's IAM policy are
refused as AWS refuses them (moto does not check the signature, so a wrong secret passes). Both are stopped by their owner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.control.pg import free_port

ACCESS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


class MotoS3:
    """moto's S3 in this process; any key pair is accepted (moto checks no signature)."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)

    def start(self) -> MotoS3:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()


class AuthMotoS3:
    """moto's server as a process that checks credentials and IAM policies. Its first three
    actions (unauthenticated) make the user `denpex` with an access key, allowed s3:* on the
    bucket `allowed` only; every later request must be signed with that key."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.key: dict[str, str] = {}

    def start(self) -> AuthMotoS3:
        import boto3

        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3", **ACCESS}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                env=env,
                stdout=out,
                stderr=out,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.url}/moto-api/", timeout=1)
                break
            except httpx.HTTPError:
                if self.proc.poll() is not None:
                    raise AssertionError(f"moto exited: {self.log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        iam = boto3.client("iam", endpoint_url=self.url, region_name="us-east-1", **_keys(ACCESS))
        iam.create_user(UserName="denpex")
        made = iam.create_access_key(UserName="denpex")["AccessKey"]
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": "s3:*",
                    "Resource": ["arn:aws:s3:::allowed", "arn:aws:s3:::allowed/*"],
                }
            ],
        }
        iam.put_user_policy(
            UserName="denpex", PolicyName="objects", PolicyDocument=json.dumps(policy)
        )
        self.key = {
            "AWS_ACCESS_KEY_ID": made["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": made["SecretAccessKey"],
        }
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _keys(env: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
    }
