// Plain SVG charts (docs/portal.md#the-web-app): the decision history per hour as stacked bars,
// one per bucket, and a risk score per day against its thresholds (DailyScores); each with a
// text summary for screen readers (role="img" and its label) and the same figures as a table
// under a disclosure. No chart library: a stacked bar chart is a few
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

/** One UTC day of a risk score (GraphQL `riskHistory`). */
export interface ScoreDay {
  day: string;
  score?: number | null;
  high?: number | null;
  published: boolean;
}

const fmtDay = new Intl.DateTimeFormat(undefined, { day: "numeric", month: "short", timeZone: "UTC" });
const dayOf = (d: string) => fmtDay.format(new Date(`${d}T00:00:00Z`));

/** A score's colour: at or above the deny line, the step-up line, or below both. */
function scoreColor(v: number, lines: { at: number }[]): string {
  const [stepUp, deny] = [...lines].map((l) => l.at).sort((a, b) => a - b);
  if (deny !== undefined && v >= deny) return "#cf222e";
  if (stepUp !== undefined && v >= stepUp) return "#bf8700";
  return "#0969da";
}

/**
 * A 0 to 100 score per UTC day: one bar per day at the day's highest score, the score at the
 * day's end as a dot, dashed lines at `lines` (the policies' thresholds), a text summary for
 * screen readers and the same figures as a table.
 */
export function DailyScores({ title, days, lines = [] }: { title: string; days: ScoreDay[]; lines?: { at: number; label: string }[] }) {
  const id = useId();
  const W = 720;
  const H = 160;
  const bw = W / Math.max(1, days.length);
  const y = (v: number) => H - (v / 100) * (H - 4);
  const known = days.filter((d) => d.high != null);
  const peak = known.reduce<ScoreDay | null>((p, d) => (p && (p.high ?? 0) >= (d.high ?? 0) ? p : d), null);
  const last = days.length ? days[days.length - 1] : null;
  const over = lines.map((l) => ({ ...l, days: known.filter((d) => (d.high ?? 0) >= l.at).length }));
  const summary = !known.length
    ? `${title}: no score in these ${days.length} days.`
    : `${title}: highest ${peak?.high} on ${dayOf(peak!.day)}, now ${last?.score ?? "none"}; ` +
      over.map((l) => `${l.days} of ${days.length} days at ${l.at} (${l.label}) or above`).join(", ") + ".";
  return (
    <figure className="chart" aria-labelledby={`${id}-cap`}>
      <figcaption id={`${id}-cap`}>
        <strong>{title}</strong>{" "}
        <span className="muted">
          (UTC days; bars: the day's highest, dots: at the day's end
          {over.map((l) => `; ${l.label} at ${l.at}`).join("")})
        </span>
      </figcaption>
      <svg viewBox={`0 0 ${W} ${H}`} preserveAspectRatio="none" role="img" aria-label={summary} data-volatile="">
        <line x1="0" y1={H - 0.5} x2={W} y2={H - 0.5} stroke="#8c959f" />
        {lines.map((l) => (
          <line key={l.at} x1="0" x2={W} y1={y(l.at)} y2={y(l.at)} stroke={scoreColor(l.at, lines)} strokeDasharray="6 4" />
        ))}
        {days.map((d, i) =>
          d.high == null ? null : (
            <g key={d.day}>
              <rect x={i * bw + bw * 0.15} width={bw * 0.7} y={y(d.high)} height={H - y(d.high)} fill={scoreColor(d.high, lines)} opacity={0.75} />
              {d.score != null && <circle cx={i * bw + bw / 2} cy={y(d.score)} r={Math.min(4, bw / 4)} fill="#1d232b" />}
            </g>
          ),
        )}
      </svg>
      <div className="axis" aria-hidden="true" data-volatile="">
        <span>{days.length ? dayOf(days[0].day) : ""}</span>
        <span>{last ? dayOf(last.day) : ""}</span>
      </div>
      <details>
        <summary>The figures as a table</summary>
        <div className="scroll">
          <table>
            <caption>{title}, day by day (UTC)</caption>
            <thead>
              <tr>
                <th scope="col">Day</th>
                <th scope="col">Highest</th>
                <th scope="col">At the day's end</th>
                <th scope="col">Published that day</th>
              </tr>
            </thead>
            <tbody>
              {days.map((d) => (
                <tr key={d.day}>
                  <td>
                    <time dateTime={d.day}>{dayOf(d.day)}</time>
                  </td>
                  <td>{d.high ?? "—"}</td>
                  <td>{d.score ?? "—"}</td>
                  <td>{d.published ? "yes" : "no"}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      </details>
    </figure>
  );
}
