// The shell: who is signed in, navigation by what the person may view, sign-out, the pages.
import { useQuery } from "@tanstack/react-query";
import { useEffect, useRef } from "react";
import { NavLink, Route, Routes, useLocation } from "react-router-dom";
import { gql, loadSession, signOut } from "./api";
import { graphql } from "./gql";
import { AssistantPage } from "./pages/Assistant";
import { ChallengesPage } from "./pages/Challenges";
import { ContainmentsPage } from "./pages/Containments";
import { DirectoryPage } from "./pages/Directory";
import { InvestigationsPage } from "./pages/Investigations";
import { OverviewPage } from "./pages/Overview";
import { DecisionPage } from "./pages/Decision";
import { DecisionsPage } from "./pages/Decisions";
import { BundlePage, DraftPage, PoliciesPage } from "./pages/Policies";
import { PrincipalPage } from "./pages/Principal";
import { AccessContext, ErrorBox, Loading, type Access } from "./ui";

const AccessQuery = graphql(`
  query Access {
    me { user expiresAt }
    access { area view administer own viewReason administerReason }
  }
`);

const NAV: { to: string; label: string; area: string; own?: boolean }[] = [
  { to: "/overview", label: "Overview", area: "decisions" },
  { to: "/decisions", label: "Decisions", area: "decisions" },
  { to: "/policies", label: "Policies", area: "policies" },
  { to: "/challenges", label: "Challenges", area: "challenges", own: true },
  { to: "/containments", label: "Containments", area: "containments" },
  { to: "/investigations", label: "Investigations", area: "investigations" },
  { to: "/directory", label: "Directory", area: "directory" },
  { to: "/assistant", label: "Assistant", area: "assistant" },
];

/** After a navigation inside the app the focus goes to the new page's content (as a page load
 * would put it at the top), so keyboard and screen-reader users start on the page they chose. */
function useFocusOnNavigation() {
  const { pathname } = useLocation();
  const first = useRef(true);
  useEffect(() => {
    if (first.current) {
      first.current = false;
      return;
    }
    document.getElementById("main")?.focus();
  }, [pathname]);
}

export function App() {
  useFocusOnNavigation();
  const q = useQuery({
    queryKey: ["access"],
    queryFn: async () => {
      await loadSession();
      return gql(AccessQuery);
    },
    enabled: window.location.pathname !== "/signed-out",
  });
  if (window.location.pathname === "/signed-out") return <SignedOut />;
  if (q.isPending)
    return (
      <main id="main" className="boot">
        <Loading what="your access" />
      </main>
    );
  if (q.isError)
    return (
      <main id="main" className="boot">
        <ErrorBox error={q.error} retry={() => q.refetch()} />
      </main>
    );
  const access: Access = Object.fromEntries(q.data.access.map((a) => [a.area, a]));
  const user = q.data.me.user;
  const nav = NAV.filter((n) => access[n.area]?.view || (n.own && access[n.area]?.own));
  return (
    <AccessContext.Provider value={{ user, access }}>
      <a className="skip" href="#main">
        Skip to content
      </a>
      <header className="top">
        <NavLink to="/" className="brand">
          svc portal
        </NavLink>
        <nav aria-label="Main">
          <ul>
            {nav.map((n) => (
              <li key={n.to}>
                <NavLink to={n.to}>{n.label}</NavLink>
              </li>
            ))}
          </ul>
        </nav>
        <div className="who">
          <span>
            Signed in as <strong id="user">{user}</strong>
          </span>
          <button type="button" onClick={() => void signOut()}>
            Sign out
          </button>
        </div>
      </header>
      <main id="main" tabIndex={-1}>
        <Routes>
          <Route path="/" element={access.decisions?.view ? <OverviewPage /> : <ChallengesPage />} />
          <Route path="/overview" element={<OverviewPage />} />
          <Route path="/containments" element={<ContainmentsPage />} />
          <Route path="/investigations" element={<InvestigationsPage />} />
          <Route path="/directory" element={<DirectoryPage />} />
          <Route path="/assistant" element={<AssistantPage />} />
          <Route path="/decisions" element={<DecisionsPage />} />
          <Route path="/decisions/:qid" element={<DecisionPage />} />
          <Route path="/principals/:type/:id" element={<PrincipalPage />} />
          <Route path="/policies" element={<PoliciesPage />} />
          <Route path="/policies/draft" element={<DraftPage />} />
          <Route path="/policies/:version" element={<BundlePage />} />
          <Route path="/challenges" element={<ChallengesPage />} />
          <Route path="*" element={<NotFound />} />
        </Routes>
      </main>
    </AccessContext.Provider>
  );
}

function NotFound() {
  return (
    <section>
      <h1>Not found</h1>
      <p>
        No page here. Go to <NavLink to="/">the start</NavLink>.
      </p>
    </section>
  );
}

function SignedOut() {
  return (
    <main id="main" className="boot">
      <section>
        <h1>Signed out</h1>
        <p>Your session has ended on the portal.</p>
        <p>
          <a href="/auth/login?next=/">Sign in again</a>
        </p>
      </section>
    </main>
  );
}
