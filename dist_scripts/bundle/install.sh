#!/usr/bin/env bash
# Installs denpex from this air-gapped bundle after verifying it, or rolls back to the
# previously installed version. Never touches the network.
# Usage: bash install.sh [--prefix DIR] [--pubkey KEY | --trust-carried-key]
#        [--with-systemd [--enable]] [--with-slurm DIR] [--with-server [--db URL] [--listen HOST:PORT]
#        [--kms URL] [--objects URL]] [--verify-only] [--rollback] [--allow-downgrade] [--force] [--help]
set -euo pipefail
umask 022

usage() {
    cat <<'USAGE'
Usage: bash install.sh [options]

Verifies this bundle, then installs denpex under PREFIX:
  PREFIX/versions/<version>/   the bundle's files (one folder per installed version)
  PREFIX/current               symlink to the version in use (switched atomically)
  PREFIX/previous              symlink to the version used before (for --rollback)
  PREFIX/bin/denpex            -> current/denpex/denpex (PREFIX/bin/denpex-static likewise)
  PREFIX/etc/agent.yaml        the agent's settings (written once, never overwritten)
  PREFIX/etc/denpex-release.pub  the release key this prefix trusts from now on

Options:
  --prefix DIR       where to install (default /opt/denpex)
  --pubkey KEY       a minisign public key you trust (the denpex release key); see TRUST
  --trust-carried-key  with no --pubkey and no key pinned in PREFIX: trust the key the bundle
                     carries (proves the bundle intact, not who made it); see TRUST
  --with-systemd     install the denpex-agent.service unit (not started)
  --systemd-dir DIR  where the unit goes (default /etc/systemd/system)
  --enable           with --with-systemd: also `systemctl enable --now denpex-agent`
  --with-slurm DIR   copy the Slurm prolog, epilog and HealthCheckProgram scripts into DIR
  --with-server      install and start the control plane (`denpex server`, inside the same
                     binary: nothing is fetched): the denpex-server.service unit when systemd
                     runs, else a background process (PREFIX/var/server/server.pid); waits
                     until it answers on --listen
  --db URL           with --with-server: its database (default: SQLite, under
                     /var/lib/denpex/server with systemd, else PREFIX/var/server), or
                     postgresql://USER:PASSWORD@HOST:PORT/DB for an existing PostgreSQL
  --listen HOST:PORT with --with-server: where it serves (default 127.0.0.1:9479)
  --kms URL          with --with-server: the key-encryption key of stored secrets:
                     pkcs11:token=LABEL;object=KEY?module=/path/libsofthsm2.so&pin-source=FILE
                     (an HSM), openbao+https://HOST:8200/KEY (Vault/OpenBao transit; BAO_TOKEN
                     in PREFIX/etc/server.env), aws:///alias/NAME, file:///PATH (default: a
                     key file in the server's state folder)
  --objects URL      with --with-server: where report archives, evidence bundles and RMA
                     attachments go: s3://BUCKET[/PREFIX]?endpoint=URL (credentials as
                     AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in PREFIX/etc/server.env) or
                     file:///PATH. Default: a local S3 endpoint, Ceph RGW on 127.0.0.1:7480
                     over a one-node cluster in the server's state folder, when Debian's
                     ceph-mon, ceph-osd and radosgw are installed; else the filesystem (the
                     server's state folder). install.sh says which it chose.
  --verifier NAME    minisign | openssl | python (default: the first one found, in that order)
  --verify-only      verify the bundle and stop; nothing is written anywhere
  --rollback         point PREFIX/current back to PREFIX/previous (no bundle needed)
  --allow-downgrade  install a version older than the one PREFIX/current points to
  --force            replace an installed copy of this version whose files differ, and
                     install on a machine whose architecture differs from the bundle's
  --i-have-verified  skip the signature check when no verifier exists on this host, because
                     you checked SHA256SUMS.minisig elsewhere (the checksums are still checked)
  -h, --help         this text

TRUST: SHA256SUMS.minisig must verify with the release key the bundle carries
(denpex-release.pub), and that key must be the key this installation trusts: --pubkey when
given, otherwise PREFIX/etc/denpex-release.pub from an earlier install. With neither, the
install is refused: a key inside the bundle proves nothing about who made the bundle, so
trusting it takes an explicit --trust-carried-key. To rotate the release key, pass the new key
with --pubkey. Relative paths (--pubkey, --with-slurm, --systemd-dir) are taken from the
folder you ran install.sh in.
This script is the verifier, so check it before running it the first time: unpack the
bundle, then `minisign -Vm SHA256SUMS -p YOUR-COPY-OF-THE-KEY && sha256sum -c SHA256SUMS`
(install.sh is listed there), or `denpex bundle verify BUNDLE --pubkey KEY` with a denpex you
already trust.
VERSIONS: a bundle older than the version PREFIX/current points to is refused unless
--allow-downgrade (a replayed old bundle must not undo a security fix); --rollback is the way
back to the previous version.
Then every file in SHA256SUMS must match and no unlisted file may be present. All of this
runs on a private copy of the bundle, before anything is written to PREFIX, and uses only
tools of this host (minisign, or openssl >= 3, or python3 with `cryptography`) - never a
program from the bundle.
The kernel is checked too: below 5.15 or without /sys/kernel/btf/vmlinux the agent falls back
to procfs and the kernel log (a warning, not a failure).

Re-running with the same bundle changes nothing. Exit status: 0 done, 1 refused, 2 bad usage.
USAGE
}

BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
PREFIX=/opt/denpex
PUBKEY=""
TRUST_CARRIED=0
ALLOW_DOWNGRADE=0
WITH_SYSTEMD=0
SYSTEMD_DIR=/etc/systemd/system
ENABLE=0
SLURM_DIR=""
WITH_SERVER=0
DB_URL=""
LISTEN=127.0.0.1:9479
KMS_URL=""
OBJECTS_URL=""
VERIFIER=auto
VERIFY_ONLY=0
ROLLBACK=0
FORCE=0
SKIP_SIGNATURE=0
SUMS=SHA256SUMS
SIG=SHA256SUMS.minisig
CARRIED=denpex-release.pub
SAFE_NAME='^[A-Za-z0-9._+@=~,-]+(/[A-Za-z0-9._+@=~,-]+)*$'

say() { echo "install.sh: $*"; }
warn() { echo "install.sh: WARNING: $*" >&2; }
die() {
    echo "install.sh: REFUSED: $*" >&2
    exit 1
}
usage_error() {
    echo "install.sh: $*" >&2
    echo "Usage: bash install.sh [--prefix DIR] [--pubkey KEY] [--with-systemd] [--with-slurm DIR] [--rollback] [--help]" >&2
    exit 2
}
need_value() { [[ $# -ge 2 && -n "$2" ]] || usage_error "$1 needs a value"; }
# A relative path means the caller's folder: resolve it now, before this script changes
# folder (a relative --pubkey resolved later would name the key inside the bundle itself)
absolute() { if [[ "$1" == /* ]]; then printf '%s' "$1"; else printf '%s/%s' "$PWD" "$1"; fi; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --prefix) need_value "$@"; PREFIX=$2; shift 2 ;;
        --pubkey) need_value "$@"; PUBKEY=$(absolute "$2"); shift 2 ;;
        --trust-carried-key) TRUST_CARRIED=1; shift ;;
        --allow-downgrade) ALLOW_DOWNGRADE=1; shift ;;
        --with-systemd) WITH_SYSTEMD=1; shift ;;
        --systemd-dir) need_value "$@"; SYSTEMD_DIR=$(absolute "$2"); shift 2 ;;
        --enable) ENABLE=1; shift ;;
        --with-slurm) need_value "$@"; SLURM_DIR=$(absolute "$2"); shift 2 ;;
        --with-server) WITH_SERVER=1; shift ;;
        --db) need_value "$@"; DB_URL=$2; shift 2 ;;
        --listen) need_value "$@"; LISTEN=$2; shift 2 ;;
        --kms) need_value "$@"; KMS_URL=$2; shift 2 ;;
        --objects) need_value "$@"; OBJECTS_URL=$2; shift 2 ;;
        --verifier) need_value "$@"; VERIFIER=$2; shift 2 ;;
        --verify-only) VERIFY_ONLY=1; shift ;;
        --rollback) ROLLBACK=1; shift ;;
        --force) FORCE=1; shift ;;
        --i-have-verified) SKIP_SIGNATURE=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage_error "unknown option $1" ;;
    esac
done

[[ "$PREFIX" =~ ^/[A-Za-z0-9._/+-]*$ ]] || usage_error "--prefix must be an absolute path of plain characters: $PREFIX"
PREFIX=${PREFIX%/}
[[ -n "$PREFIX" ]] || usage_error "--prefix / is not allowed"
[[ $ENABLE -eq 0 || $WITH_SYSTEMD -eq 1 ]] || usage_error "--enable goes with --with-systemd"
if [[ $WITH_SERVER -eq 0 && ( -n "$DB_URL" || -n "$KMS_URL" || -n "$OBJECTS_URL" || "$LISTEN" != 127.0.0.1:9479 ) ]]; then
    usage_error "--db, --listen, --kms and --objects go with --with-server"
fi
[[ -z "$DB_URL" || "$DB_URL" =~ ^(sqlite:///|postgresql(\+psycopg)?://)[^[:space:]\']+$ ]] ||
    usage_error "--db: sqlite:///PATH or postgresql://USER@HOST:PORT/DB"
[[ -z "$KMS_URL" || "$KMS_URL" =~ ^(pkcs11:|openbao\+https?://|vault\+https?://|aws:|file:///)[^[:space:]\']*$ ]] ||
    usage_error "--kms: pkcs11:…, openbao+https://…, aws:…, or file:///PATH"
[[ -z "$OBJECTS_URL" || "$OBJECTS_URL" =~ ^(s3://[a-z0-9][a-z0-9.-]+[a-z0-9](/[^[:space:]\']*)?(\?[^[:space:]\']*)?|file:///[^[:space:]\'?]+)$ ]] ||
    usage_error "--objects: s3://BUCKET[/PREFIX][?endpoint=URL…] or file:///PATH"
[[ "$LISTEN" =~ ^[A-Za-z0-9.:_-]+:[0-9]+$ ]] || usage_error "--listen: HOST:PORT"
[[ -z "$PUBKEY" || $TRUST_CARRIED -eq 0 ]] || usage_error "--pubkey and --trust-carried-key exclude each other"
[[ -z "$PUBKEY" || -r "$PUBKEY" ]] || usage_error "--pubkey $PUBKEY: cannot read it"
case "$VERIFIER" in auto | minisign | openssl | python) ;; *) usage_error "--verifier: minisign, openssl or python" ;; esac

WORK=$(mktemp -d "${TMPDIR:-/tmp}/denpex-install.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# ---------------------------------------------------------------- rollback (no bundle needed)

relink() { # relink TARGET LINK: atomically make LINK point to TARGET, unless it already does
    local target=$1 link=$2
    [[ -L "$link" && "$(readlink "$link")" == "$target" ]] && return 0
    ln -sfn "$target" "$link.new.$$"
    mv -Tf "$link.new.$$" "$link"
}

check_installed() { # check_installed DIR: the files of an installed version still match
    (cd "$1" && sha256sum --quiet --strict -c "$SUMS" >/dev/null 2>&1)
}

if [[ $ROLLBACK -eq 1 ]]; then
    [[ -L "$PREFIX/previous" ]] || die "no previous version recorded in $PREFIX (nothing to roll back to)"
    prev=$(readlink "$PREFIX/previous")
    cur=$(readlink "$PREFIX/current" 2>/dev/null || true)
    [[ -d "$PREFIX/$prev" ]] || die "$PREFIX/$prev is gone; cannot roll back"
    check_installed "$PREFIX/$prev" || die "$PREFIX/$prev no longer matches its SHA256SUMS; reinstall it from its bundle"
    relink "$prev" "$PREFIX/current"
    [[ -n "$cur" ]] && relink "$cur" "$PREFIX/previous"
    say "rolled back: $PREFIX/current -> $prev (was ${cur:-nothing})"
    exit 0
fi

# ---------------------------------------------------------------- bundle metadata and copy

[[ -f "$BUNDLE/$SUMS" && -f "$BUNDLE/$SIG" && -f "$BUNDLE/$CARRIED" && -f "$BUNDLE/BUNDLE-INFO" ]] ||
    die "$BUNDLE is not a complete denpex bundle ($SUMS, $SIG, $CARRIED, BUNDLE-INFO expected)"

# a private copy: what is verified is exactly what gets installed
PAYLOAD="$WORK/payload"
cp -R "$BUNDLE" "$PAYLOAD" 2>/dev/null || die "cannot copy the bundle to $WORK (space in ${TMPDIR:-/tmp}?)"
cd "$PAYLOAD"

# ---------------------------------------------------------------- signature

decode_key() { # decode_key FILE OUT: the 42 raw bytes of a minisign public key file
    local body
    body=$(grep -v '^untrusted comment:' "$1" | grep -v '^[[:space:]]*$' || true)
    [[ $(wc -l <<<"$body") -eq 1 ]] || die "$2: not a minisign public key ($1)"
    base64 -d <<<"$body" >"$WORK/$2" 2>/dev/null || die "$1: invalid base64 in the public key"
    [[ $(wc -c <"$WORK/$2") -eq 42 && "$(head -c 2 "$WORK/$2")" == "Ed" ]] || die "$1: not an Ed25519 minisign public key"
}

key_id() { # as minisign prints it: the 8 bytes as a little-endian number in hex
    tail -c +3 "$1" | head -c 8 | od -An -v -tx1 | tr -s ' \n' '\n\n' | grep . | tac | tr -d '\n' | tr a-f A-F
}

decode_key "$CARRIED" carried.raw
if [[ -n "$PUBKEY" ]]; then
    ANCHOR=$PUBKEY
    anchor_what="the key you passed with --pubkey"
elif [[ -f "$PREFIX/etc/denpex-release.pub" ]]; then
    ANCHOR="$PREFIX/etc/denpex-release.pub"
    anchor_what="the key this prefix trusts ($ANCHOR)"
elif [[ $TRUST_CARRIED -eq 1 ]]; then
    ANCHOR="$PAYLOAD/$CARRIED"
    anchor_what=""
else
    die "no release key to trust: pass --pubkey with your own copy of the denpex release key (the bundle's key $(key_id "$WORK/carried.raw") proves it intact, not who made it; --trust-carried-key accepts it anyway)"
fi
decode_key "$ANCHOR" anchor.raw
cmp -s "$WORK/anchor.raw" "$WORK/carried.raw" ||
    die "the bundle carries release key $(key_id "$WORK/carried.raw"), not $anchor_what ($(key_id "$WORK/anchor.raw")); it was not made with the key you trust"

verify_minisign() {
    minisign -V -q -m "$SUMS" -x "$SIG" -p "$ANCHOR" >/dev/null 2>&1
}

split_signature() { # the signature file's parts as files under $WORK
    local lines
    lines=$(grep -c '' "$SIG")
    [[ $lines -eq 4 ]] || die "$SIG: expected 4 lines, found $lines"
    [[ "$(sed -n 1p "$SIG")" == "untrusted comment: "* && "$(sed -n 3p "$SIG")" == "trusted comment: "* ]] ||
        die "$SIG: not a minisign signature"
    sed -n 2p "$SIG" | base64 -d >"$WORK/sig.raw" 2>/dev/null || die "$SIG: invalid base64"
    sed -n 4p "$SIG" | base64 -d >"$WORK/global.sig" 2>/dev/null || die "$SIG: invalid base64"
    [[ $(wc -c <"$WORK/sig.raw") -eq 74 && $(wc -c <"$WORK/global.sig") -eq 64 ]] || die "$SIG: wrong lengths"
    [[ "$(tail -c +3 "$WORK/sig.raw" | head -c 8 | od -An -tx1)" == "$(tail -c +3 "$WORK/anchor.raw" | head -c 8 | od -An -tx1)" ]] ||
        die "$SIG: made with key $(key_id "$WORK/sig.raw"), not with the trusted key $(key_id "$WORK/anchor.raw")"
    tail -c 64 "$WORK/sig.raw" >"$WORK/data.sig"
    local comment
    comment=$(sed -n 3p "$SIG")
    { cat "$WORK/data.sig"; printf '%s' "${comment#trusted comment: }"; } >"$WORK/global.msg"
}

verify_openssl() {
    local alg
    split_signature
    alg=$(head -c 2 "$WORK/sig.raw")
    case "$alg" in
        ED) openssl dgst -blake2b512 -binary "$SUMS" >"$WORK/data.msg" ;;
        Ed) cp "$SUMS" "$WORK/data.msg" ;;
        *) die "$SIG: unknown signature algorithm" ;;
    esac
    # SubjectPublicKeyInfo for Ed25519 (RFC 8410): a fixed 12-byte header + the 32-byte key
    { printf '\x30\x2a\x30\x05\x06\x03\x2b\x65\x70\x03\x21\x00'; tail -c 32 "$WORK/anchor.raw"; } >"$WORK/pub.der"
    openssl pkey -pubin -inform DER -in "$WORK/pub.der" -out "$WORK/pub.pem" 2>/dev/null || return 1
    openssl pkeyutl -verify -pubin -inkey "$WORK/pub.pem" -rawin -in "$WORK/data.msg" \
        -sigfile "$WORK/data.sig" >/dev/null 2>&1 || return 1
    openssl pkeyutl -verify -pubin -inkey "$WORK/pub.pem" -rawin -in "$WORK/global.msg" \
        -sigfile "$WORK/global.sig" >/dev/null 2>&1
}

verify_python() {
    split_signature
    # -I: isolated (no PYTHONPATH, no user site, not the current folder)
    python3 -I - "$WORK" "$SUMS" <<'PY'
import hashlib, sys
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
work, sums = sys.argv[1], sys.argv[2]
read = lambda name: open(f"{work}/{name}", "rb").read()
raw, key = read("sig.raw"), Ed25519PublicKey.from_public_bytes(read("anchor.raw")[10:])
data = open(sums, "rb").read()
msg = hashlib.blake2b(data, digest_size=64).digest() if raw[:2] == b"ED" else data
key.verify(read("data.sig"), msg)
key.verify(read("global.sig"), read("global.msg"))
PY
}

have_openssl3() {
    command -v openssl >/dev/null && [[ "$(openssl version 2>/dev/null)" =~ ^OpenSSL\ ([3-9]|[1-9][0-9]) ]]
}
have_python_crypto() {
    command -v python3 >/dev/null && python3 -I -c 'import cryptography.hazmat.primitives.asymmetric.ed25519' 2>/dev/null
}

if [[ "$VERIFIER" == auto ]]; then
    if command -v minisign >/dev/null; then
        VERIFIER=minisign
    elif have_openssl3; then
        VERIFIER=openssl
    elif have_python_crypto; then
        VERIFIER=python
    else
        VERIFIER=none
    fi
fi
case "$VERIFIER" in
    minisign) command -v minisign >/dev/null || die "--verifier minisign: minisign is not installed" ;;
    openssl) have_openssl3 || die "--verifier openssl: needs OpenSSL 3 or later" ;;
    python) have_python_crypto || die "--verifier python: needs python3 with the cryptography package" ;;
esac

if [[ "$VERIFIER" == none ]]; then
    if [[ $SKIP_SIGNATURE -eq 0 ]]; then
        die "no trusted verifier on this host (minisign, openssl >= 3, or python3 with cryptography). Install one, or check $SIG elsewhere and rerun with --i-have-verified"
    fi
    warn "*** SIGNATURE NOT CHECKED (--i-have-verified): you vouch for $BUNDLE ***"
else
    "verify_$VERIFIER" || die "$SIG does not verify with release key $(key_id "$WORK/anchor.raw") ($VERIFIER): the bundle was altered or not signed by that key"
    say "signature ok: release key $(key_id "$WORK/anchor.raw") (checked with $VERIFIER)"
    [[ -z "$anchor_what" ]] && warn "trusted the key the bundle carries (--trust-carried-key): this proves the bundle intact, not who made it"
fi

# ---------------------------------------------------------------- checksums, no extra files

[[ -z "$(find . ! -type d ! -type f -print -quit)" ]] || die "the bundle holds links or special files: $(find . ! -type d ! -type f -print -quit)"
while IFS= read -r line; do
    [[ "$line" =~ ^[0-9a-f]{64}\ [\ *](.+)$ ]] || die "$SUMS: malformed line: $line"
    name=${BASH_REMATCH[1]}
    [[ "$name" =~ $SAFE_NAME && "/$name/" != */../* && "/$name/" != */./* ]] || die "$SUMS: unsafe path $name"
    printf '%s\n' "$name"
done <"$SUMS" | LC_ALL=C sort >"$WORK/listed"
{ echo "$SUMS"; echo "$SIG"; cat "$WORK/listed"; } | LC_ALL=C sort >"$WORK/expected"
find . -type f | sed 's|^\./||' | LC_ALL=C sort >"$WORK/present"
extra=$(LC_ALL=C comm -13 "$WORK/expected" "$WORK/present" | head -n 1)
[[ -z "$extra" ]] || die "$extra is in the bundle but not in $SUMS (unlisted file)"
missing=$(LC_ALL=C comm -23 "$WORK/expected" "$WORK/present" | head -n 1)
[[ -z "$missing" ]] || die "$missing is listed in $SUMS but missing"
bad=$(sha256sum --strict -c "$SUMS" 2>/dev/null | grep -v ': OK$' | head -n 1 || true)
[[ -z "$bad" ]] || die "checksum mismatch: $bad (the bundle was altered or damaged)"
say "checksums ok: $(wc -l <"$WORK/listed") files"

VERSION=$(sed -n 's/^version=//p' BUNDLE-INFO)
ARCH=$(sed -n 's/^arch=//p' BUNDLE-INFO)
[[ "$VERSION" =~ ^[A-Za-z0-9._+-]+$ ]] || die "BUNDLE-INFO: bad version '$VERSION'"
if [[ "$ARCH" != "$(uname -m)" ]]; then
    [[ $FORCE -eq 1 ]] || die "this bundle is for $ARCH, this machine is $(uname -m) (--force to install anyway)"
    warn "installing a $ARCH bundle on $(uname -m) (--force)"
fi

# ---------------------------------------------------------------- no downgrade by accident

older_than() { # older_than A B: version A sorts before version B (sort -V)
    [[ "$1" != "$2" && "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" == "$1" ]]
}
installed=$(readlink "$PREFIX/current" 2>/dev/null || true)
installed=${installed#versions/}
if [[ -n "$installed" ]] && older_than "$VERSION" "$installed"; then
    [[ $ALLOW_DOWNGRADE -eq 1 ]] || die "this bundle is denpex $VERSION, older than the installed $installed (--allow-downgrade to install it anyway, --rollback to go back to the previous version)"
    warn "downgrading from $installed to $VERSION (--allow-downgrade)"
fi

# ---------------------------------------------------------------- kernel (warn only)

release=${DENPEX_INSTALL_KERNEL_RELEASE:-$(uname -r)}
btf=${DENPEX_INSTALL_BTF:-/sys/kernel/btf/vmlinux}
IFS=.- read -r kmajor kminor _ <<<"$release"
if ! [[ "$kmajor" =~ ^[0-9]+$ && "$kminor" =~ ^[0-9]+$ ]] || ((kmajor < 5 || (kmajor == 5 && kminor < 15))); then
    warn "kernel $release is older than 5.15: eBPF collectors stay off; the agent uses procfs and the kernel log"
elif [[ ! -e "$btf" ]]; then
    warn "no $btf (kernel without BTF): eBPF collectors stay off; the agent uses procfs and the kernel log"
else
    say "kernel $release with BTF: eBPF collectors can load"
fi

if [[ $VERIFY_ONLY -eq 1 ]]; then
    say "verified denpex $VERSION ($ARCH); nothing installed (--verify-only)"
    exit 0
fi

# ---------------------------------------------------------------- install

changed=0
DEST="$PREFIX/versions/$VERSION"
mkdir -p "$PREFIX/versions" "$PREFIX/bin" "$PREFIX/etc"
if [[ -d "$DEST" ]] && cmp -s "$DEST/$SUMS" "$SUMS" && check_installed "$DEST"; then
    say "denpex $VERSION is already installed in $DEST and intact"
else
    if [[ -e "$DEST" && $FORCE -eq 0 ]]; then
        die "$DEST exists with other or damaged contents; rerun with --force to replace it"
    fi
    partial="$PREFIX/versions/.$VERSION.partial.$$"
    rm -rf "$partial"
    cp -R "$PAYLOAD" "$partial"
    check_installed "$partial" || { rm -rf "$partial"; die "the copy in $partial does not match (disk full?)"; }
    if [[ -e "$DEST" ]]; then
        mv -T "$DEST" "$PREFIX/versions/.$VERSION.old.$$"
        mv -T "$partial" "$DEST"
        rm -rf "$PREFIX/versions/.$VERSION.old.$$"
    else
        mv -T "$partial" "$DEST"
    fi
    changed=1
    say "installed denpex $VERSION into $DEST"
fi

current=$(readlink "$PREFIX/current" 2>/dev/null || true)
if [[ "$current" != "versions/$VERSION" ]]; then
    [[ -n "$current" ]] && relink "$current" "$PREFIX/previous"
    relink "versions/$VERSION" "$PREFIX/current"
    changed=1
    say "$PREFIX/current -> versions/$VERSION${current:+ (previous: $current)}"
fi
relink ../current/denpex/denpex "$PREFIX/bin/denpex"
relink ../current/denpex-static "$PREFIX/bin/denpex-static"

install_file() { # install_file SRC DEST MODE: copy with @PREFIX@ filled in, only when different
    local src=$1 dest=$2 mode=$3
    sed "s|@PREFIX@|$PREFIX|g" "$src" >"$WORK/filled"
    if [[ -f "$dest" ]] && cmp -s "$WORK/filled" "$dest"; then
        return 0
    fi
    mkdir -p "$(dirname "$dest")"
    install -m "$mode" "$WORK/filled" "$dest.new.$$"
    mv -f "$dest.new.$$" "$dest"
    changed=1
    say "wrote $dest"
}

if [[ ! -f "$PREFIX/etc/agent.yaml" ]]; then
    install_file config/agent.yaml "$PREFIX/etc/agent.yaml" 0644
fi
if ! cmp -s "$PREFIX/etc/denpex-release.pub" "$CARRIED" 2>/dev/null; then
    install -m 0644 "$CARRIED" "$PREFIX/etc/denpex-release.pub"
    changed=1
    say "this prefix now trusts release key $(key_id "$WORK/carried.raw") ($PREFIX/etc/denpex-release.pub)"
fi

if [[ $WITH_SYSTEMD -eq 1 ]]; then
    install_file systemd/denpex-agent.service "$SYSTEMD_DIR/denpex-agent.service" 0644
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
        systemctl daemon-reload
        if [[ $ENABLE -eq 1 ]]; then
            systemctl enable --now denpex-agent.service
        else
            say "start it with: systemctl enable --now denpex-agent"
        fi
    else
        warn "systemd is not running here: the unit is in place but was not loaded"
    fi
fi

if [[ -n "$SLURM_DIR" ]]; then
    for script in prolog.sh epilog.sh healthcheck.sh; do
        install_file "slurm/$script" "$SLURM_DIR/denpex-$script" 0755
    done
    say "Slurm: set Prolog=$SLURM_DIR/denpex-prolog.sh Epilog=$SLURM_DIR/denpex-epilog.sh HealthCheckProgram=$SLURM_DIR/denpex-healthcheck.sh in slurm.conf"
fi

# ---------------------------------------------------------------- the control plane

systemd_running() { # DENPEX_INSTALL_SYSTEMD=0: as if it were not (tests, containers)
    [[ "${DENPEX_INSTALL_SYSTEMD:-1}" != 0 && -d /run/systemd/system ]] && command -v systemctl >/dev/null
}

server_answers() { # server_answers HOST PORT: GET /healthz answers 200 (bash only, no curl)
    local host=$1 port=$2 reply
    exec 9<>"/dev/tcp/$host/$port" 2>/dev/null || return 1
    printf 'GET /healthz HTTP/1.0\r\nHost: %s\r\n\r\n' "$host" >&9
    IFS= read -r -t 5 reply <&9 || reply=""
    exec 9<&- 9>&-
    [[ "$reply" == "HTTP/1."?" 200"* ]]
}

if [[ $WITH_SERVER -eq 1 ]]; then
    if systemd_running; then
        SERVER_STATE=/var/lib/denpex/server
    else
        SERVER_STATE="$PREFIX/var/server"
    fi
    DB_URL=${DB_URL:-sqlite:///$SERVER_STATE/control.db}
    # the object store: the one asked for, else a local RGW when Ceph is here, else files
    RGW_STATE=${SERVER_STATE%/server}/rgw
    RGW_ENV=""
    if [[ -n "$OBJECTS_URL" ]]; then
        OBJECTS_SAID="object store: ${OBJECTS_URL%%\?*} (as asked)"
    elif ! bash objects/rgw-single-node.sh check 2>"$WORK/rgw.err"; then
        OBJECTS_URL="file://$SERVER_STATE/objects"
        OBJECTS_SAID="object store: the filesystem, $SERVER_STATE/objects (no local S3 server: $(tail -1 "$WORK/rgw.err" | sed 's/^rgw-single-node: //'))"
    elif RGW_ENV=$(bash objects/rgw-single-node.sh start "$RGW_STATE" 7480 2>"$WORK/rgw.err"); then
        OBJECTS_URL="s3://denpex/cp?endpoint=http://127.0.0.1:7480&create=1&checksum=md5"
        OBJECTS_SAID="object store: S3 on Ceph RGW at http://127.0.0.1:7480 (one node, $RGW_STATE)"
    else
        OBJECTS_URL="file://$SERVER_STATE/objects"
        OBJECTS_SAID="object store: the filesystem, $SERVER_STATE/objects (the local Ceph RGW did not start: $(tail -1 "$WORK/rgw.err" | sed 's/^rgw-single-node: //'))"
    fi
    # credentials (a database password, BAO_TOKEN) live in server.env, 0600, never in the unit
    {
        echo "# written by install.sh --with-server; the control plane reads it at start"
        # single quotes: a pkcs11: or postgresql:// URL holds ; & ? (the checks above refuse ')
        echo "DENPEX_SERVER_DB='$DB_URL'"
        [[ -n "$KMS_URL" ]] && echo "DENPEX_KMS='$KMS_URL'"
        echo "DENPEX_OBJECTS='$OBJECTS_URL'"
        [[ -n "$RGW_ENV" ]] && echo "$RGW_ENV"
        keep='^(#|DENPEX_SERVER_DB=|DENPEX_KMS=|DENPEX_OBJECTS='
        [[ -n "$RGW_ENV" ]] && keep+='|AWS_ACCESS_KEY_ID=|AWS_SECRET_ACCESS_KEY='
        [[ -f "$PREFIX/etc/server.env" ]] && grep -Ev "$keep)" "$PREFIX/etc/server.env"
    } >"$WORK/server.env" || true
    if ! cmp -s "$WORK/server.env" "$PREFIX/etc/server.env" 2>/dev/null; then
        install -m 0600 "$WORK/server.env" "$PREFIX/etc/server.env"
        changed=1
        say "wrote $PREFIX/etc/server.env (database${KMS_URL:+, KMS} and object store)"
    fi
    say "$OBJECTS_SAID"
    if [[ -n "$RGW_ENV" ]] && systemd_running; then
        # the RGW daemons come back after a reboot before the control plane that needs them
        sed -e "s|@PREFIX@|$PREFIX|g" -e "s|@RGW_STATE@|$RGW_STATE|g" systemd/denpex-rgw.service \
            >"$WORK/denpex-rgw.service"
        install_file "$WORK/denpex-rgw.service" "$SYSTEMD_DIR/denpex-rgw.service" 0644
        systemctl daemon-reload
        systemctl enable denpex-rgw.service
    fi
    host=${LISTEN%:*}
    port=${LISTEN##*:}
    [[ "$host" == 0.0.0.0 ]] && host=127.0.0.1
    if systemd_running; then
        sed "s|@LISTEN@|$LISTEN|g" systemd/denpex-server.service >"$WORK/denpex-server.service"
        install_file "$WORK/denpex-server.service" "$SYSTEMD_DIR/denpex-server.service" 0644
        systemctl daemon-reload
        systemctl enable denpex-server.service
        systemctl restart denpex-server.service
    else
        mkdir -p "$SERVER_STATE"
        chmod 0700 "$SERVER_STATE"
        if [[ -f "$SERVER_STATE/server.pid" ]] && kill -0 "$(cat "$SERVER_STATE/server.pid")" 2>/dev/null; then
            kill "$(cat "$SERVER_STATE/server.pid")"
            for _ in $(seq 100); do kill -0 "$(cat "$SERVER_STATE/server.pid")" 2>/dev/null || break; sleep 0.1; done
        fi
        warn "systemd is not running here: starting the control plane as a background process"
        (
            set -a
            # shellcheck disable=SC1091
            . "$PREFIX/etc/server.env"
            set +a
            cd /
            DENPEX_STATE_DIR="$SERVER_STATE" exec setsid "$PREFIX/bin/denpex" server --listen "$LISTEN" \
                </dev/null >>"$SERVER_STATE/server.log" 2>&1
        ) &
        echo $! >"$SERVER_STATE/server.pid"
    fi
    for _ in $(seq 600); do
        server_answers "$host" "$port" && break
        sleep 0.2
    done
    server_answers "$host" "$port" || die "the control plane did not answer on $LISTEN (see ${SERVER_STATE}/server.log or journalctl -u denpex-server)"
    changed=1
    say "control plane on http://$LISTEN (${DB_URL%%://*}); a login token: (set -a; . $PREFIX/etc/server.env; $PREFIX/bin/denpex server token --tenant T --role admin)"
fi

if [[ $changed -eq 0 ]]; then
    say "nothing to do: denpex $VERSION is installed and current in $PREFIX"
else
    say "done: $PREFIX/bin/denpex (denpex $VERSION); roll back with: bash install.sh --prefix $PREFIX --rollback"
fi
