// Plain SVG charts of the decision history per hour (docs/portal.md#the-web-app): stacked bars,
// one per bucket, with a text summary for screen readers (role="img" and its label) and the
// same figures as a table under a disclosure. No chart library: a stacked bar chart is a few
// rectangles, and the app stays small.
import { useId } from "react";

export interface Series {
  key: string;
  label: string;
  color: string;
}

export interface Bucket {
  at: string;
  [key: string]: number | string;
}

const HOUR_MS = 3_600_000;
const fmtHour = new Intl.DateTimeFormat(undefined, { weekday: "short", hour: "2-digit", minute: "2-digit" });

/** The buckets of `[since, until)` hour by hour, zeros where the history has none. */
export function everyHour<T extends Bucket>(rows: T[], since: Date, until: Date, keys: string[]): Bucket[] {
  const byAt = new Map(rows.map((r) => [new Date(r.at).getTime(), r]));
  const out: Bucket[] = [];
  const first = Math.floor(since.getTime() / HOUR_MS) * HOUR_MS;
  for (let t = first; t < until.getTime(); t += HOUR_MS) {
    const row = byAt.get(t);
    const b: Bucket = { at: new Date(t).toISOString() };
    for (const k of keys) b[k] = row ? Number(row[k] ?? 0) : 0;
    out.push(b);
  }
  return out;
}

function total(b: Bucket, series: Series[]): number {
  return series.reduce((n, s) => n + Number(b[s.key] ?? 0), 0);
}

/** A stacked bar chart of `series` per bucket, its legend, and a table of the same figures. */
export function StackedBars({ title, buckets, series }: { title: string; buckets: Bucket[]; series: Series[] }) {
  const id = useId();
  const W = 720;
  const H = 160;
  const peak = Math.max(1, ...buckets.map((b) => total(b, series)));
  const bw = W / Math.max(1, buckets.length);
  const sums = series.map((s) => buckets.reduce((n, b) => n + Number(b[s.key] ?? 0), 0));
  const summary =
    `${title}: ` + series.map((s, i) => `${sums[i].toLocaleString()} ${s.label.toLowerCase()}`).join(", ") +
    `; busiest hour ${peak.toLocaleString()}.`;
  return (
    <figure className="chart" aria-labelledby={`${id}-cap`}>
      <figcaption id={`${id}-cap`}>
        <strong>{title}</strong>{" "}
        <span className="muted">
          (peak <span data-volatile="">{peak.toLocaleString()}</span> per hour)
        </span>
      </figcaption>
      <ul className="legend" aria-hidden="true">
        {series.map((s, i) => (
          <li key={s.key}>
            <span className="swatch" style={{ background: s.color }} /> {s.label}{" "}
            <span data-volatile="">{sums[i].toLocaleString()}</span>
          </li>
        ))}
      </ul>
      <svg viewBox={`0 0 ${W} ${H}`} preserveAspectRatio="none" role="img" aria-label={summary} data-volatile="">
        <line x1="0" y1={H - 0.5} x2={W} y2={H - 0.5} stroke="#8c959f" />
        {buckets.map((b, i) => {
          let y = H;
          return (
            <g key={b.at}>
              {series.map((s) => {
                const v = Number(b[s.key] ?? 0);
                if (!v) return null;
                const h = (v / peak) * (H - 4);
                y -= h;
                return <rect key={s.key} x={i * bw + bw * 0.1} width={bw * 0.8} y={y} height={h} fill={s.color} />;
              })}
            </g>
          );
        })}
      </svg>
      <div className="axis" aria-hidden="true" data-volatile="">
        <span>{buckets.length ? fmtHour.format(new Date(buckets[0].at)) : ""}</span>
        <span>{buckets.length ? fmtHour.format(new Date(buckets[buckets.length - 1].at)) : ""}</span>
      </div>
      <details>
        <summary>The figures as a table</summary>
        <div className="scroll">
          <table>
            <caption>{title}, hour by hour</caption>
            <thead>
              <tr>
                <th scope="col">Hour starting</th>
                {series.map((s) => (
                  <th scope="col" key={s.key}>{s.label}</th>
                ))}
              </tr>
            </thead>
            <tbody>
              {buckets.map((b) => (
                <tr key={b.at}>
                  <td>
                    <time dateTime={b.at}>{fmtHour.format(new Date(b.at))}</time>
                  </td>
                  {series.map((s) => (
                    <td key={s.key}>{Number(b[s.key] ?? 0).toLocaleString()}</td>
                  ))}
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      </details>
    </figure>
  );
}
