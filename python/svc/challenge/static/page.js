// The challenge page's script (docs/challenges.md#the-page): reads the JSON of /page/api,
// shows it, and answers through it. WebAuthn through navigator.credentials with the browser's
// JSON helpers (WebAuthn Level 3, sections 5.1.8 to 5.1.10). Every POST carries the session's
// CSRF token in X-CSRF-Token.
"use strict";

let csrf = "";

function $(id) { return document.getElementById(id); }

function say(text, error) {
  const s = $("status");
  s.textContent = text;
  s.className = error ? "error" : "";
}

async function api(path, body) {
  const init = { credentials: "same-origin", headers: { Accept: "application/json" } };
  if (body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.headers["X-CSRF-Token"] = csrf;
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  if (r.status === 204) return null;
  const data = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(data.detail || data.title || `HTTP ${r.status}`);
  return data;
}

async function createKey(optionsJson) {
  const publicKey = PublicKeyCredential.parseCreationOptionsFromJSON(JSON.parse(optionsJson));
  const cred = await navigator.credentials.create({ publicKey });
  return JSON.stringify(cred.toJSON());
}

async function getAssertion(optionsJson) {
  const publicKey = PublicKeyCredential.parseRequestOptionsFromJSON(JSON.parse(optionsJson));
  const cred = await navigator.credentials.get({ publicKey });
  return JSON.stringify(cred.toJSON());
}

function text(id, value) { $(id).textContent = value; }

function entity(e) { return e ? `${e.type}::"${e.id}"` : "(acting alone)"; }

async function signIn() {
  const me = await api("/page/api/me");
  csrf = me.csrf;
  text("user", me.user);
  $("logout").addEventListener("click", async () => {
    await api("/auth/logout", {});
    location.href = "/keys";
  });
}

async function guarded(fn, done) {
  try {
    say("…");
    await fn();
    say(done);
  } catch (e) {
    say(e.message || String(e), true);
  }
}

// -- a challenge

function qidOfPage() { return decodeURIComponent(location.pathname.split("/").pop()); }

function showChallenge(c) {
  text("who", c.principal.type + "::" + JSON.stringify(c.principal.id));
  text("obo", entity(c.on_behalf_of));
  text("action", c.action);
  text("resource", entity(c.resource));
  text("kinds", c.kinds.join(", "));
  text("satisfied", c.satisfied.join(", ") || "nothing yet");
  const st = $("state");
  st.textContent = c.state;
  st.className = "state " + c.state;
  text("expires", new Date(c.expires_at).toLocaleString());
  text("answerers", `${c.person}${c.approver ? " (approver: " + c.approver + ")" : ""}`);
  const why = $("why");
  why.replaceChildren(...c.why.map((w) => { const li = document.createElement("li"); li.textContent = w; return li; }));
  $("justification-shown").classList.toggle("hidden", !c.justification);
  text("justification-text", c.justification);
  $("verify").classList.toggle("hidden", !c.can_verify);
  $("no-key").classList.toggle("hidden", !(c.can_verify && !c.has_keys));
  $("verify-button").disabled = !c.has_keys;
  $("justify").classList.toggle("hidden", !c.can_justify);
  $("decide").classList.toggle("hidden", !c.can_decide);
}

async function challengePage() {
  await signIn();
  const qid = qidOfPage();
  $("register-link").href = "/keys?back=" + encodeURIComponent("/challenge/" + qid);
  const load = async () => showChallenge(await api(`/page/api/challenges/${encodeURIComponent(qid)}`));
  await load();
  $("verify-button").addEventListener("click", () => guarded(async () => {
    const begin = await api(`/page/api/challenges/${qid}/verification/begin`, {});
    const credential_json = await getAssertion(begin.options_json);
    await api(`/page/api/challenges/${qid}/verification/finish`, { ceremony_id: begin.ceremony_id, credential_json });
    await load();
  }, "Verified with your security key."));
  $("justify-button").addEventListener("click", () => guarded(async () => {
    await api(`/page/api/challenges/${qid}/justify`, { text: $("justify-text").value });
    await load();
  }, "Justification sent."));
  for (const [id, approve] of [["approve-button", true], ["reject-button", false]]) {
    $(id).addEventListener("click", () => guarded(async () => {
      await api(`/page/api/challenges/${qid}/decide`, { approve, reason: $("decide-reason").value });
      await load();
    }, approve ? "Approved." : "Rejected."));
  }
  say("");
}

// -- keys

function keyRow(k, reload) {
  const tr = document.createElement("tr");
  for (const v of [k.name || "(no name)", k.credential_id.slice(0, 12) + "…", String(k.sign_count), new Date(k.created_at).toLocaleString()]) {
    const td = document.createElement("td");
    td.textContent = v;
    tr.append(td);
  }
  const td = document.createElement("td");
  const change = document.createElement("button");
  change.textContent = "Change";
  change.className = "change";
  change.addEventListener("click", () => guarded(async () => {
    const begin = await api("/page/api/keys/change/begin", { credential_id: k.credential_id, name: $("key-name").value });
    say("Touch the key you are replacing…");
    const assertion_json = await getAssertion(begin.assertion_options_json);
    say("Now touch the new key…");
    const credential_json = await createKey(begin.options_json);
    await api("/page/api/keys/register/finish", { ceremony_id: begin.ceremony_id, credential_json, assertion_json });
    await reload();
  }, "Key changed."));
  const remove = document.createElement("button");
  remove.textContent = "Remove";
  remove.className = "danger remove";
  remove.addEventListener("click", () => guarded(async () => {
    await api("/page/api/keys/remove", { credential_id: k.credential_id });
    await reload();
  }, "Key removed."));
  td.append(change, " ", remove);
  tr.append(td);
  return tr;
}

async function keysPage() {
  await signIn();
  const back = new URLSearchParams(location.search).get("back");
  if (back && /^\/challenge\/[A-Za-z0-9-]+$/.test(back)) {
    $("back").href = back;
    $("back-section").classList.remove("hidden");
  }
  const reload = async () => {
    const { keys } = await api("/page/api/keys");
    $("keys").replaceChildren(...keys.map((k) => keyRow(k, reload)));
    $("no-keys").classList.toggle("hidden", keys.length > 0);
  };
  await reload();
  $("register-button").addEventListener("click", () => guarded(async () => {
    const begin = await api("/page/api/keys/register/begin", { name: $("key-name").value });
    const credential_json = await createKey(begin.options_json);
    await api("/page/api/keys/register/finish", { ceremony_id: begin.ceremony_id, credential_json });
    await reload();
  }, "Key registered."));
  say("");
}

document.addEventListener("DOMContentLoaded", () => {
  const run = document.body.dataset.page === "keys" ? keysPage : challengePage;
  run().catch((e) => say(e.message || String(e), true));
});
