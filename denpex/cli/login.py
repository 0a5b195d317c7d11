"""`denpex login`: sign in with the organisation's OpenID provider (authorization code +
PKCE, a loopback redirect) and keep the token for `denpex` commands that call the server."""

from __future__ import annotations

import argparse
import sys

from denpex.cli.common import UsageError

DESCRIPTION = """\
Sign in with your OpenID provider. denpex prints the provider's login URL (and opens it with
--browser), waits for the redirect on a loopback port, verifies the ID token and stores the
tokens in $XDG_CONFIG_HOME/denpex/credentials.json (mode 0600; DENPEX_CREDENTIALS overrides).
The OIDC configuration is the file the server uses (--oidc FILE, or DENPEX_OIDC_CONFIG);
its `login:` section names the client id.
"""


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "login",
        help="sign in with the OpenID provider (authorization code + PKCE)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--oidc", metavar="FILE", help="the OIDC configuration (YAML)")
    parser.add_argument("--browser", action="store_true", help="open the URL in a browser")
    parser.add_argument(
        "--timeout", metavar="S", type=float, default=300.0, help="wait at most S seconds"
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import os

    from denpex.enterprise import OidcConfig, OidcConfigError, OidcError
    from denpex.enterprise.oidc_login import credentials_path, login

    path = args.oidc or os.environ.get("DENPEX_OIDC_CONFIG")
    if not path:
        raise UsageError("name the OIDC configuration: --oidc FILE (or DENPEX_OIDC_CONFIG)")
    try:
        config = OidcConfig.load(path)
        saved = login(
            config,
            announce=lambda url: print(
                f"open this URL to sign in:\n{url}", file=sys.stderr, flush=True
            ),
            open_browser=args.browser,
            timeout_s=args.timeout,
        )
    except (OidcConfigError, OidcError) as exc:
        raise UsageError(str(exc)) from None
    print(
        f"denpex login: signed in as {saved['subject']}; token in {credentials_path()}",
        file=sys.stderr,
    )
    return 0
