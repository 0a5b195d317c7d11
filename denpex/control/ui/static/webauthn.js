// Security keys (WebAuthn) for the second factor: a button carrying data-webauthn="register"
// or "login" asks the server for options, hands them to navigator.credentials, and posts the
// authenticator's answer back as JSON with the page's CSRF token. No inline script: the CSP
// allows only files served by denpex.
(function () {
  "use strict";
  function bytes(b64url) {
    var b64 = b64url.replace(/-/g, "+").replace(/_/g, "/");
    var raw = atob(b64 + "===".slice((b64.length + 3) % 4));
    return Uint8Array.from(raw, function (c) { return c.charCodeAt(0); });
  }
  function b64url(buffer) {
    var s = String.fromCharCode.apply(null, new Uint8Array(buffer));
    return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }
  function post(url, csrf, body) {
    return fetch(url, {
      method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json", "X-Denpex-CSRF": csrf},
      body: JSON.stringify(body || {})
    }).then(function (r) {
      return r.json().then(function (data) { if (!r.ok) { throw new Error(data.error || r.status); } return data; });
    });
  }
  function answer(credential, next) {
    var r = credential.response, out = {
      id: credential.id, rawId: b64url(credential.rawId), type: credential.type,
      clientExtensionResults: {}, response: {clientDataJSON: b64url(r.clientDataJSON)}, next: next
    };
    if (r.attestationObject) { out.response.attestationObject = b64url(r.attestationObject); }
    if (r.authenticatorData) { out.response.authenticatorData = b64url(r.authenticatorData); }
    if (r.signature) { out.response.signature = b64url(r.signature); }
    if (r.userHandle) { out.response.userHandle = b64url(r.userHandle); }
    return out;
  }
  function run(button) {
    var kind = button.dataset.webauthn, csrf = button.dataset.csrf, next = button.dataset.next || "/";
    var status = document.getElementById("webauthn-status");
    var base = kind === "register" ? "/mfa/webauthn" : "/login/webauthn";
    post(base + "/options", csrf).then(function (o) {
      o.challenge = bytes(o.challenge);
      (o.allowCredentials || []).concat(o.excludeCredentials || []).forEach(function (c) { c.id = bytes(c.id); });
      if (kind === "register") {
        o.user.id = bytes(o.user.id);
        return navigator.credentials.create({publicKey: o});
      }
      return navigator.credentials.get({publicKey: o});
    }).then(function (credential) {
      return post(kind === "register" ? base + "/register" : base, csrf, answer(credential, next));
    }).then(function (done) {
      if (kind === "register") { status.textContent = "Security key registered."; }
      else { window.location.assign(done.next); }
    }).catch(function (err) { status.textContent = "The security key was not accepted (" + err.message + ")."; });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-webauthn]").forEach(function (b) {
      if (!window.PublicKeyCredential) { b.disabled = true; return; }
      b.addEventListener("click", function () { run(b); });
    });
  });
})();
