// Cedar source shown with its tokens marked (keywords, strings, annotations, comments), one
// numbered line at a time; lines in `marked` are highlighted (the deciding policy). And the
// policy editor: a plain textarea over the same highlighting (CedarEditor, below).
import { useRef, type ReactNode, type UIEvent } from "react";
import "./cedar.css";

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

/**
 * The policy editor: a native textarea whose text is transparent, over a `<pre>` that shows the
 * same text highlighted with the tokenizer above, in the same font, padding and line height, its
 * scroll kept with the textarea's. The textarea stays what is focused, typed in, selected, read
 * by screen readers and spell-checked (off), so editing, undo, IME and accessibility are the
 * browser's own; the highlighted layer and the line numbers are hidden from assistive
 * technology. `notes` mark their lines and columns in the layer (the messages themselves are
 * listed with the editor, `describedBy`).
 */
export function CedarEditor({
  value,
  onChange,
  label,
  notes = [],
  describedBy,
}: {
  value: string;
  onChange: (text: string) => void;
  label: string;
  notes?: Note[];
  describedBy?: string;
}) {
  const layer = useRef<HTMLPreElement>(null);
  const gutter = useRef<HTMLDivElement>(null);
  const lines = value.split("\n");
  const bad = new Map<number, Note[]>();
  for (const n of notes) bad.set(n.line, [...(bad.get(n.line) ?? []), n]);
  function sync(e: UIEvent<HTMLTextAreaElement>) {
    const t = e.currentTarget;
    if (layer.current) {
      layer.current.scrollTop = t.scrollTop;
      layer.current.scrollLeft = t.scrollLeft;
    }
    if (gutter.current) gutter.current.scrollTop = t.scrollTop;
  }
  return (
    <div className="cedar-editor">
      <div className="gutter" ref={gutter} aria-hidden="true">
        {lines.map((_, i) => (
          <div key={i} className={bad.has(i + 1) ? "invalid" : undefined}>
            {i + 1}
          </div>
        ))}
      </div>
      <div className="layers">
        <pre className="highlight" ref={layer} aria-hidden="true">
          {lines.map((l, i) => {
            const here = bad.get(i + 1);
            return (
              <div key={i} className={here ? "line invalid" : "line"}>
                {here
                  ? marked(l, here.map((n) => n.column))
                  : tokens(l)}
                {"\n"}
              </div>
            );
          })}
        </pre>
        <textarea
          className="editor"
          aria-label={label}
          aria-invalid={notes.length > 0 || undefined}
          aria-describedby={describedBy}
          spellCheck={false}
          autoCapitalize="off"
          autoComplete="off"
          autoCorrect="off"
          wrap="off"
          value={value}
          onChange={(e) => onChange(e.target.value)}
          onScroll={sync}
        />
      </div>
    </div>
  );
}

/** A line's tokens with the characters at `columns` (1-based) underlined as errors. */
function marked(line: string, columns: number[]): ReactNode[] {
  const cols = [...new Set(columns.map((c) => Math.max(1, c) - 1))].sort((a, b) => a - b);
  const out: ReactNode[] = [];
  let last = 0;
  for (const c of cols) {
    if (c < last) continue;
    const at = Math.min(c, line.length);
    if (at > last) out.push(<span key={`t${last}`}>{tokens(line.slice(last, at))}</span>);
    // past the line's end the mark is a space: the error is where more was expected
    out.push(
      <span key={`e${at}`} className="err">
        {line[at] ?? " "}
      </span>,
    );
    last = at + 1;
  }
  if (last < line.length) out.push(<span key={`t${last}`}>{tokens(line.slice(last))}</span>);
  return out;
}
