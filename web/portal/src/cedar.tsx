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

export function CedarSource({
  text,
  marked,
  label,
}: {
  text: string;
  marked?: Set<number>;
  label: string;
}) {
  const lines = text.replace(/\n$/, "").split("\n");
  return (
    <div className="scroll" tabIndex={0} role="region" aria-label={label}>
      <pre className="cedar">
        {lines.map((l, i) => (
          <div key={i} className={marked?.has(i + 1) ? "line marked" : "line"}>
            <span className="ln" aria-hidden="true">
              {i + 1}
            </span>
            <code>{tokens(l)}</code>
          </div>
        ))}
      </pre>
    </div>
  );
}
