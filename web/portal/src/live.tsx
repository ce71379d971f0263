// Live pages (docs/portal.md#live-updates): a subscription's events refresh the TanStack Query
// caches a page shows, the page polls while the socket is down, and says which it is doing.
import { useQueryClient, type QueryKey } from "@tanstack/react-query";
import { useEffect, useRef, useState, useSyncExternalStore } from "react";
import { liveStatus, onLiveStatus, subscribe, type LiveState } from "./api";
import { graphql } from "./gql";
import type { TypedDocumentString } from "./gql/graphql";
import "./live.css";

/** The challenges queue as it changes (everyone's, or with `mine` the viewer's own). */
export const QueueLive = graphql(`
  subscription ChallengeQueueLive($mine: Boolean!) {
    challengeChanges(mine: $mine) { qid state }
  }
`);

/** Every containment, then each contain and lift. */
export const ContainmentsLive = graphql(`
  subscription ContainmentsLive {
    containmentChanges { contained }
  }
`);

/** How often a page asks again while its subscription is not live (ms). */
export const POLL_MS = 5_000;

/** The socket's state, as a React value. */
export function useLiveState(): LiveState {
  return useSyncExternalStore(onLiveStatus, liveStatus);
}

/**
 * Follows a persisted subscription while `enabled`, and invalidates the queries under `keys` on
 * each event (coalesced over 100 ms, so a subscription's first burst refetches once) and once
 * more after a reconnect. Answers `live` while the socket is up and the subscription was not
 * refused; a page polls (`refetchInterval: pollUnlessLive(state)`) otherwise.
 */
export function useLiveQueries<R, V>(
  doc: TypedDocumentString<R, V>,
  variables: V,
  keys: QueryKey[],
  enabled = true,
): LiveState | "off" {
  const client = useQueryClient();
  const socket = useLiveState();
  const [refused, setRefused] = useState(false);
  const keysRef = useRef(keys);
  keysRef.current = keys;
  const timer = useRef<ReturnType<typeof setTimeout> | null>(null);
  const vars = JSON.stringify(variables ?? {});

  useEffect(() => {
    if (!enabled) return;
    setRefused(false);
    const refresh = () => {
      if (timer.current) return;
      timer.current = setTimeout(() => {
        timer.current = null;
        for (const queryKey of keysRef.current) void client.invalidateQueries({ queryKey });
      }, 100);
    };
    const stop = subscribe(doc, JSON.parse(vars) as V, { next: refresh, error: () => setRefused(true) });
    return () => {
      stop();
      if (timer.current) clearTimeout(timer.current);
      timer.current = null;
    };
  }, [client, doc, vars, enabled]);

  // Back after a drop: what changed meanwhile is fetched once (polling covered the gap).
  const was = useRef(socket);
  useEffect(() => {
    if (enabled && socket === "live" && was.current === "reconnecting") {
      for (const queryKey of keysRef.current) void client.invalidateQueries({ queryKey });
    }
    was.current = socket;
  }, [client, socket, enabled]);

  if (!enabled || refused) return "off";
  return socket;
}

/** A query's `refetchInterval`: none while live, `POLL_MS` otherwise. */
export function pollUnlessLive(state: LiveState | "off"): number | false {
  return state === "live" ? false : POLL_MS;
}

const SAID: Record<LiveState | "off", string> = {
  connecting: "Connecting…",
  live: "Live",
  reconnecting: "Reconnecting…",
  ended: "Not live: sign in again",
  off: "Refreshing every 5 s",
};

/**
 * The page's live state, small beside its title: a polite status, so a screen reader hears a
 * change (live, reconnecting) without losing its place. Its width does not change with its
 * text (the screenshots mask it as a volatile value).
 */
export function LiveStatus({ state }: { state: LiveState | "off" }) {
  return (
    <p className={`live-status ${state}`} role="status" aria-live="polite" data-volatile="">
      <span className="dot" aria-hidden="true" />
      {SAID[state]}
    </p>
  );
}
