// Assistant: a question answered by the install's model with the portal's read-only
// operations, each made as the signed-in person (and checked as such).
import { useMutation } from "@tanstack/react-query";
import { useState, type FormEvent } from "react";
import { gql } from "../api";
import { graphql } from "../gql";
import { ErrorBox, Loading, useTitle } from "../ui";

const Ask = graphql(`
  query Ask($question: String!) {
    ask(question: $question) { answer steps { tool arguments ok } }
  }
`);

export function AssistantPage() {
  useTitle("Assistant");
  const [question, setQuestion] = useState("");
  const m = useMutation({ mutationFn: (q: string) => gql(Ask, { question: q }) });
  function submit(e: FormEvent) {
    e.preventDefault();
    if (question.trim()) m.mutate(question.trim());
  }
  return (
    <>
      <h1>Assistant</h1>
      <section aria-labelledby="ask-h">
        <h2 id="ask-h">Ask</h2>
        <p className="hint">
          It reads what you may read (decisions, risks, containments, challenges), as you; it changes nothing.
        </p>
        <form onSubmit={submit}>
          <label>
            Question
            <textarea className="question" value={question} onChange={(e) => setQuestion(e.target.value)} rows={3} maxLength={2000} />
          </label>
          <button type="submit" className="primary" disabled={m.isPending}>
            Ask
          </button>
        </form>
      </section>
      {(m.isPending || m.isError || m.data) && (
        <section aria-labelledby="ans-h" aria-live="polite">
          <h2 id="ans-h">Answer</h2>
          {m.isPending && <Loading what="the answer" />}
          {m.isError && <ErrorBox error={m.error} />}
          {m.data && (
            <>
              <p className="answer">{m.data.ask.answer}</p>
              {m.data.ask.steps.length > 0 && (
                <details>
                  <summary>What it looked up ({m.data.ask.steps.length})</summary>
                  <ol>
                    {m.data.ask.steps.map((s, i) => (
                      <li key={i}>
                        <code>{s.tool}</code> {JSON.stringify(s.arguments)} {s.ok ? "" : "(refused)"}
                      </li>
                    ))}
                  </ol>
                </details>
              )}
            </>
          )}
        </section>
      )}
    </>
  );
}
