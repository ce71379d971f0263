// The portal's API as the app calls it: the session (GET /api/v1/me, POST /auth/logout) and
// GraphQL by persisted operation (the operation's hash only; python/svc/portal/webapp.py), and
// its subscriptions over a websocket (below).
import { createClient, type Client } from "graphql-ws";
import type { TypedDocumentString } from "./gql/graphql";

export interface Session {
  user: string;
  csrf: string;
  expires_at: string;
}

/** A GraphQL error as the portal sends it: a refusal carries the decision's qid. */
export class ApiError extends Error {
  code: string;
  decisionQid?: string;
  constructor(message: string, code: string, decisionQid?: string) {
    super(message);
    this.code = code;
    this.decisionQid = decisionQid;
  }
}

let session: Session | null = null;

/** Sends the browser to the provider's sign-in, coming back to where it was. */
export function signIn(): never {
  const next = window.location.pathname + window.location.search;
  window.location.assign(`/auth/login?next=${encodeURIComponent(next)}`);
  throw new ApiError("signing in", "UNAUTHENTICATED");
}

/** The signed-in person, or a redirect to sign in. */
export async function loadSession(): Promise<Session> {
  const r = await fetch("/api/v1/me", { credentials: "same-origin" });
  if (r.status === 401) signIn();
  if (!r.ok) throw new ApiError(`the portal answered ${r.status}`, "UNAVAILABLE");
  session = (await r.json()) as Session;
  return session;
}

export async function signOut(): Promise<void> {
  if (session) {
    await fetch("/auth/logout", {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRF-Token": session.csrf },
    });
  }
  session = null;
  window.location.assign("/signed-out");
}

interface GqlResponse<T> {
  data?: T;
  errors?: { message: string; extensions?: Record<string, unknown> }[];
}

/** Runs one of the app's persisted operations and answers its data (ApiError otherwise). */
export async function gql<R, V>(
  doc: TypedDocumentString<R, V>,
  ...[variables]: V extends Record<string, never> ? [] | [V] : [V]
): Promise<R> {
  const s = session ?? (await loadSession());
  const hash = (doc as unknown as { __meta__?: { hash: string } }).__meta__?.hash;
  const r = await fetch("/graphql", {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": s.csrf },
    body: JSON.stringify({
      variables: variables ?? {},
      extensions: { persistedQuery: { version: 1, sha256Hash: hash } },
    }),
  });
  if (r.status === 401) signIn();
  const body = (await r.json().catch(() => ({}))) as GqlResponse<R> & { detail?: string };
  if (!r.ok) throw new ApiError(body.detail ?? `the portal answered ${r.status}`, `HTTP_${r.status}`);
  if (body.errors?.length) {
    const e = body.errors[0];
    const ext = e.extensions ?? {};
    throw new ApiError(e.message, String(ext.code ?? "ERROR"), ext.decision_qid as string | undefined);
  }
  return body.data as R;
}

// -- Live updates: GraphQL subscriptions over graphql-transport-ws (docs/portal.md#live-updates).
// One socket per tab to /graphql (same origin: the browser sends the session cookie and the
// portal's Origin, which the portal checks at the upgrade), made when a page first subscribes.
// Subscriptions follow the persisted-operations rule of `gql` above: only the operation's hash
// is sent (`query` empty), the portal puts the text in. After a drop the client reconnects with
// randomised exponential backoff (capped at 30 s) and subscribes again; the portal closes the
// socket with 4401 once the session ends, which is not retried.

/** The socket's state: `live` while connected, `reconnecting` after a drop, `ended` for good. */
export type LiveState = "connecting" | "live" | "reconnecting" | "ended";

let liveState: LiveState = "connecting";
const liveListeners = new Set<() => void>();

function setLive(next: LiveState): void {
  if (next === liveState) return;
  liveState = next;
  for (const l of liveListeners) l();
}

/** The socket's state now (for `useSyncExternalStore`). */
export function liveStatus(): LiveState {
  return liveState;
}

/** Calls `listener` on each change of the socket's state; answers the unsubscribe. */
export function onLiveStatus(listener: () => void): () => void {
  liveListeners.add(listener);
  return () => liveListeners.delete(listener);
}

/** Close codes after which reconnecting cannot help (the protocol's and the portal's). */
const FINAL_CLOSES = new Set([4400, 4401, 4406, 4409, 4429, 4500]);

let socket: Client | null = null;

function liveClient(): Client {
  if (socket) return socket;
  const url = new URL("/graphql", window.location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  let connectedBefore = false;
  socket = createClient({
    url: url.toString(),
    lazy: true,
    lazyCloseTimeout: 5_000, // kept across a page change, closed once no page subscribes
    keepAlive: 10_000,
    retryAttempts: Infinity,
    shouldRetry: () => true,
    retryWait: async (retries) => {
      const cap = Math.min(30_000, 1_000 * 2 ** retries);
      await new Promise((r) => setTimeout(r, cap / 2 + Math.random() * (cap / 2)));
    },
    on: {
      connecting: () => setLive(connectedBefore ? "reconnecting" : "connecting"),
      connected: () => {
        connectedBefore = true;
        setLive("live");
      },
      closed: (event) => {
        const code = (event as { code?: number } | undefined)?.code ?? 0;
        if (FINAL_CLOSES.has(code)) setLive("ended");
        else if (code === 1000) {
          connectedBefore = false; // closed on purpose: no page subscribes any more
          setLive("connecting");
        } else if (liveState === "live") setLive("reconnecting");
      },
      error: () => {
        if (liveState === "live" || liveState === "connecting") setLive("reconnecting");
      },
    },
  });
  return socket;
}

/** What a subscription's events go to. */
export interface LiveSink<R> {
  next: (data: R) => void;
  /** The subscription ended with an error: a refusal (its decision's qid), or the socket's end. */
  error: (e: ApiError) => void;
}

/**
 * Subscribes to one of the app's persisted subscriptions; answers the unsubscribe. Events go
 * to `sink.next`; a GraphQL error in an event (a refusal) ends it through `sink.error`.
 */
export function subscribe<R, V>(
  doc: TypedDocumentString<R, V>,
  variables: V,
  sink: LiveSink<R>,
): () => void {
  const hash = (doc as unknown as { __meta__?: { hash: string } }).__meta__?.hash;
  let done = false;
  const fail = (e: ApiError) => {
    if (!done) sink.error(e);
    done = true;
  };
  const dispose = liveClient().subscribe<R>(
    {
      query: "",
      variables: (variables ?? {}) as Record<string, unknown>,
      extensions: { persistedQuery: { version: 1, sha256Hash: hash } },
    },
    {
      next: (result) => {
        if (result.errors?.length) {
          const e = result.errors[0];
          const ext = (e.extensions ?? {}) as Record<string, unknown>;
          fail(new ApiError(e.message, String(ext.code ?? "ERROR"), ext.decision_qid as string | undefined));
          return;
        }
        if (result.data) sink.next(result.data as R);
      },
      error: (err) => {
        if (Array.isArray(err) && err.length) {
          const e = err[0] as { message: string; extensions?: Record<string, unknown> };
          const ext = e.extensions ?? {};
          fail(new ApiError(e.message, String(ext.code ?? "ERROR"), ext.decision_qid as string | undefined));
        } else {
          fail(new ApiError("the live connection ended", "LIVE_ENDED"));
        }
      },
      complete: () => {
        done = true;
      },
    },
  );
  return () => {
    done = true;
    dispose();
  };
}
