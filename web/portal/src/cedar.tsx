// Cedar source shown with its tokens marked (keywords, strings, annotations, comments), one
// numbered line at a time; lines in `marked` are highlighted (the deciding policy).
import type { ReactNode } from "react";

const TOKEN =
  /(\/\/[^\n]*)|("(?:[^"\\]|\\.)*")|(@[A-Za-z_]\w*)|\b(permit|forbid|when|unless|principal|action|resource|context|in|is|has|like|if|then|else|true|false)\b|([A-Z][A-Za-z0-9_]*(?=::))/g;

function tokens(line: string): ReactNode[] {
  const out: ReactNode[] = [];
  let last = 0;
  for (const m of line.matchAll(TOKEN)) {
    const i = m.index ?? 0;
    if (i > last) out.push(line.slice(last, i));
    const cls = m[1] ? "c" : m[2] ? "s" : m[3] ? "a" : m[4] ? "k" : "t";
    out.push(
      <span key={i} className={`tok-${cls}`}>
        {m[0]}
      </span>,
    );
    last = i + m[0].length;
  }
  if (last < line.length) out.push(line.slice(last));
  return out;
}

/** A validation problem at a line and column (1-based) of the source. */
export interface Note {
  line: number;
  column: number;
  message: string;
}

export function CedarSource({
  text,
  marked,
  label,
  notes = [],
}: {
  text: string;
  marked?: Set<number>;
  label: string;
  notes?: Note[];
}) {
  const lines = text.replace(/\n$/, "").split("\n");
  return (
    <div className="scroll" tabIndex={0} role="region" aria-label={label}>
      <pre className="cedar">
        {lines.map((l, i) => {
          const here = notes.filter((n) => n.line === i + 1);
          return (
            <div key={i}>
              <div className={here.length ? "line invalid" : marked?.has(i + 1) ? "line marked" : "line"}>
                <span className="ln" aria-hidden="true">
                  {i + 1}
                </span>
                <code>{tokens(l)}</code>
              </div>
              {here.map((n, k) => (
                <div key={k} className="note" role="note">
                  <span className="ln" aria-hidden="true" />
                  <span>
                    <span className="caret" aria-hidden="true">{" ".repeat(Math.max(0, n.column - 1))}^</span>
                    {` line ${n.line}, column ${n.column}: ${n.message}`}
                  </span>
                </div>
              ))}
            </div>
          );
        })}
      </pre>
    </div>
  );
}
