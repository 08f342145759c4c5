// The console's one script: fetch the page's JSON (body[data-api]), render it, and fetch it
// again whenever the websocket says one of the page's topics (body[data-topics]) changed.
// Data is only ever set as text (textContent, setAttribute), never parsed as markup.
"use strict";

(() => {
  const page = document.body.dataset.page;
  const api = document.body.dataset.api;
  const topics = document.body.dataset.topics;
  const $ = (id) => document.getElementById(id);

  // -- building blocks ------------------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  // Links from the record (pull requests, threads) are followed only if they are web links.
  function safeUrl(url) {
    return typeof url === "string" && /^https?:\/\//i.test(url) ? url : null;
  }

  function link(url, text) {
    const href = safeUrl(url);
    return href ? el("a", {href, target: "_blank", rel: "noopener noreferrer"}, text || url) : text || "";
  }

  const ticketLink = (id) => el("a", {href: `/console/tickets/${encodeURIComponent(id)}`}, id);

  function ago(iso) {
    if (!iso) return "never";
    const seconds = Math.round((Date.now() - Date.parse(iso)) / 1000);
    const past = seconds >= 0;
    let n = Math.abs(seconds);
    let unit = "s";
    for (const [u, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
      if (n >= size) { n = Math.floor(n / size); unit = u; break; }
    }
    return past ? `${n}${unit} ago` : `in ${n}${unit}`;
  }

  const when = (iso) => el("time", {datetime: iso, title: iso ? new Date(iso).toLocaleString() : null}, ago(iso));
  const num = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString());
  const usd = (x) => `$${Number(x || 0).toFixed(4)}`;
  const pct = (rate) => (rate === null || rate === undefined ? "–" : `${Math.round(rate * 100)}%`);

  const TONES = {
    good: ["completed", "finished", "online", "explicit", "ready", "info"],
    warn: ["waiting_human", "waiting_device", "candidate", "awaiting_approval", "warning", "queued", "delivered"],
    bad: ["failed", "stopped", "revoked", "refused", "expired", "cancelled", "critical", "dead"],
    info: ["running", "open", "router", "subscribers", "report"],
  };

  function badge(text, tone) {
    const found = tone || Object.keys(TONES).find((t) => TONES[t].includes(text)) || "";
    return el("span", {class: `badge ${found}`}, text);
  }

  // columns: [{h: header, f: row => content, num: true?}]
  function table(columns, rows, empty) {
    if (!rows.length) return el("p", {class: "quiet"}, empty);
    return el("table", {},
      el("thead", {}, el("tr", {}, columns.map((c) => el("th", {class: c.num ? "num" : null}, c.h)))),
      el("tbody", {}, rows.map((row) => el("tr", {}, columns.map((c) => el("td", {class: c.num ? "num" : null}, c.f(row)))))));
  }

  const section = (title, ...content) => [el("h2", {}, title), ...content.flat(Infinity)];

  function card(title, tone, ...content) {
    return el("section", {class: `card attention ${tone || ""}`}, el("h2", {}, title), ...content);
  }

  // -- pages ----------------------------------------------------------------------------

  const render = {};

  render.overview = (d) => {
    const a = d.attention;
    const out = [];
    const s = d.status;
    if (s.paused) {
      const why = s.paused.reason ? `: ${s.paused.reason}` : "";
      out.push(el("p", {class: "note"},
        `Paused ${s.paused.ago} by ${s.paused.by || "?"}${why}. Events are recorded; `,
        el("code", {}, "superagent resume"), " continues."));
    }
    if (a.questions.length) {
      out.push(card(`Questions (${a.questions.length})`, "", table([
        {h: "Ticket", f: (t) => ticketLink(t.id)},
        {h: "Title", f: (t) => t.title},
        {h: "Waiting on", f: (t) => badge(t.hold || "people", "warn")},
        {h: "Asks", f: (t) => t.question || t.summary || ""},
        {h: "Since", f: (t) => when(t.updated_at)},
      ], a.questions)));
    }
    if (a.reviews.length || a.approvals.length) {
      const parts = [];
      if (a.reviews.length) {
        parts.push(table([
          {h: "Ticket", f: (t) => ticketLink(t.id)},
          {h: "Title", f: (t) => t.title},
          {h: "Pull request", f: (t) => link(t.pr_url)},
          {h: "Since", f: (t) => when(t.updated_at)},
        ], a.reviews));
      }
      if (a.approvals.length) {
        parts.push(el("p", {class: "quiet"}, "Commands a device holds until someone there approves them (",
          el("code", {}, "endpointd approvals"), "):"));
        parts.push(table([
          {h: "Device", f: (c) => c.device},
          {h: "Command", f: (c) => el("code", {}, c.what)},
          {h: "Rule", f: (c) => c.approval_rule || ""},
          {h: "Ticket", f: (c) => (c.ticket_id ? ticketLink(c.ticket_id) : "")},
          {h: "Gives up", f: (c) => when(c.approval_deadline)},
        ], a.approvals));
      }
      out.push(card(`Reviews (${a.reviews.length + a.approvals.length})`, "", parts));
    }
    if (a.failed_tickets.length || a.dead_effects.length) {
      const parts = [];
      if (a.failed_tickets.length) {
        parts.push(table([
          {h: "Ticket", f: (t) => ticketLink(t.id)},
          {h: "Title", f: (t) => t.title},
          {h: "State", f: (t) => badge(t.state === "failed" ? "failed" : t.hold)},
          {h: "Why", f: (t) => t.summary || ""},
          {h: "When", f: (t) => when(t.updated_at)},
        ], a.failed_tickets));
      }
      if (a.dead_effects.length) {
        parts.push(el("p", {class: "quiet"}, "Actions the outbox gave up on:"));
        parts.push(table([
          {h: "Kind", f: (e) => e.kind},
          {h: "Key", f: (e) => e.key},
          {h: "Attempts", f: (e) => num(e.attempts), num: true},
          {h: "Last error", f: (e) => e.last_error || ""},
          {h: "Given up", f: (e) => when(e.dead_at)},
        ], a.dead_effects));
      }
      out.push(card(`Failures (${a.failed_tickets.length + a.dead_effects.length})`, "bad", parts));
    }
    if (a.unanswered.length) {
      out.push(card(`Unanswered requests (${a.unanswered.length})`, "bad", [
        el("p", {class: "quiet"}, "Requests from allowlisted people the router has not acted on; `superagent triggers show ID` shows its calls and their refusals:"),
        table([
          {h: "Request", f: (r) => el("code", {}, r.id)},
          {h: "From", f: (r) => r.actor_name},
          {h: "Thread", f: (r) => `${r.source}:${r.thread}`},
          {h: "Text", f: (r) => r.text},
          {h: "State", f: (r) => [badge(r.state), el("div", {class: "quiet"}, r.route_error || "")]},
          {h: "Since", f: (r) => when(r.created_at)},
        ], a.unanswered)]));
    }
    if (a.failed_calls.length) {
      const failed = a.failed_calls.reduce((n, c) => n + c.calls, 0);
      out.push(card(`Failing model calls (${failed} of ${s.model_calls} in the last ${s.calls_within})`, "bad", table([
        {h: "Outcome", f: (c) => badge(c.outcome)},
        {h: "Calls", f: (c) => num(c.calls), num: true},
        {h: "Last error", f: (c) => c.last_error || ""},
        {h: "Last", f: (c) => when(c.last_at)},
      ], a.failed_calls)));
    }
    if (a.quarantined.length) {
      out.push(card(`Set aside (${a.quarantined.length})`, "bad", [
        el("p", {class: "quiet"}, "Events the router could not decide and tickets whose rounds kept failing, each with its reason; fix the cause, then put it back:"),
        table([
          {h: "What", f: (q) => (q.kind === "ticket" ? ticketLink(q.id) : el("code", {}, q.id))},
          {h: "Why", f: (q) => q.reason},
          {h: "Since", f: (q) => when(q.since)},
          {h: "Put back", f: (q) => el("code", {}, q.release)},
        ], a.quarantined)]));
    }
    if (a.findings.length) {
      out.push(card(`Watchdog findings (${a.findings.length})`, "", table([
        {h: "Severity", f: (f) => badge(f.severity)},
        {h: "Kind", f: (f) => f.kind},
        {h: "Subject", f: (f) => (f.subject.startsWith("tkt_") ? ticketLink(f.subject) : f.subject)},
        {h: "Finding", f: (f) => f.summary},
        {h: "Seen", f: (f) => [`${f.times_seen}× since `, when(f.first_seen_at)]},
        {h: "Done about it", f: (f) => f.actions.join("; ") || "–"},
      ], a.findings)));
    }
    if (d.quiet) out.push(el("p", {class: "allwell"}, "All is well: nothing needs you."));
    const fact = (label, value) => el("div", {}, el("b", {}, value), label);
    out.push(...section("Status", el("div", {class: "card"},
      el("div", {class: "strip"},
        fact("waiting for the router", num(s.router_inbox)),
        fact("active tickets", num(s.tickets_active)),
        fact("workers running", num(s.workers_running)),
        fact("waiting for a device", num(s.tickets_waiting_device)),
        fact("devices online", `${num(s.devices_online)} of ${num(s.devices_paired)}`)),
      el("dl", {class: "facts"},
        el("dt", {}, "Router leader"), el("dd", {}, s.leader),
        el("dt", {}, "Model"), el("dd", {}, el("span", {class: d.model.configured ? null : "note"}, d.model.text)),
        el("dt", {}, "Channels"), el("dd", {}, d.channels.join(", ") || "none",
          d.chat ? [" · talk to the agent in the ", el("a", {href: "/console/chat"}, "web chat")] : null),
        el("dt", {}, "Health"), el("dd", {}, el("a", {href: "/healthz"}, "/healthz"), " · ",
          el("a", {href: "/readyz"}, "/readyz"), " · API: ", el("a", {href: "/docs"}, "/docs"))))));
    return out;
  };

  render.tickets = (d) => [table([
    {h: "Ticket", f: (t) => ticketLink(t.id)},
    {h: "Title", f: (t) => t.title},
    {h: "State", f: (t) => [badge(t.state), t.hold ? ` ${t.hold}` : ""]},
    {h: "Device", f: (t) => t.device || "–"},
    {h: "Asked by", f: (t) => t.initiator || "–"},
    {h: "Tokens", f: (t) => num(t.tokens), num: true},
    {h: "Cost", f: (t) => usd(t.cost_usd), num: true},
    {h: "Updated", f: (t) => when(t.updated_at)},
  ], d.tickets, d.everything ? "No tickets yet." : "No open tickets.")];

  function output(c) {
    const pre = el("pre", {class: "output", "data-live": c.live ? "true" : null});
    if (!c.output_size) {
      pre.append(c.live ? "(no output yet)" : "(no output)");
      return pre;
    }
    pre.append(c.output);
    if (c.output_hidden_bytes) {
      pre.append(el("span", {class: "gap"}, `\n… ${num(c.output_hidden_bytes)} bytes not shown …\n`));
      pre.append(c.output_end);
    }
    return pre;
  }

  function command(c) {
    const status = [badge(c.state)];
    if (c.exit_code !== null && c.exit_code !== undefined) status.push(` exit ${c.exit_code}`);
    if (c.signal) status.push(` signal ${c.signal}`);
    if (c.timed_out) status.push(" timed out");
    return el("div", {class: "card command", "data-command": c.id},
      el("div", {class: "what"}, c.what),
      el("div", {class: "quiet"}, status, ` · ${c.device} · `, when(c.created_at),
        c.output_size ? [" · ", el("a", {href: `/console/api/commands/${encodeURIComponent(c.id)}/output`, target: "_blank"},
          `full output (${num(c.output_size)} bytes)`)] : null),
      c.error ? el("p", {class: "error"}, c.error) : null,
      c.approval_rule && c.live ? el("p", {class: "note"}, `Waiting for approval on the device: ${c.approval_rule}`) : null,
      output(c));
  }

  render.ticket = (d) => {
    ticketActions(d);
    const facts = [
      ["Title", d.title],
      ["State", [badge(d.state), d.hold ? ` ${d.hold}` : ""]],
      ["Device", d.device || "–"],
      ["Asked by", d.initiator || "–"],
      ["Scope", d.scope || "–"],
      ["Pull request", d.pull_request ? link(d.pull_request) : "–"],
      ["Spent", `${num(d.tokens)} tokens, ${usd(d.cost_usd)}`],
      ["Updated", when(d.updated_at)],
    ];
    if (d.device_access) facts.splice(3, 0, ["Device access", d.device_access]);
    if (d.speculative) facts.push(["Speculative", "yes: nothing is said unless the worker confirms a fix"]);
    if (d.wait_until) facts.push(["Waits until", when(d.wait_until)]);
    if (d.worker) facts.push(["Worker", [`round ${d.worker.id} on ${d.worker.lease_owner || "?"}, lease until `, when(d.worker.lease_expires_at)]]);
    return [
      el("dl", {class: "facts card"}, facts.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
      ...section("Threads", table([
        {h: "", f: (t) => t.relation},
        {h: "Source", f: (t) => t.source},
        {h: "Thread", f: (t) => link(t.url, t.title || t.external_id)},
        {h: "Since", f: (t) => when(t.created_at)},
      ], d.threads, "No threads.")),
      ...section("Reports", table([
        {h: "Status", f: (r) => badge(r.status)},
        {h: "Summary", f: (r) => r.summary},
        {h: "Question", f: (r) => r.question || ""},
        {h: "When", f: (r) => when(r.at)},
      ], d.reports, "No reports yet.")),
      ...section("Rounds", timeline(d.timeline, api)),
      ...section("Commands", d.commands.length ? d.commands.map(command) : el("p", {class: "quiet"}, "No commands yet.")),
    ];
  };

  // -- the ticket's timeline: what its worker was told, said, called and got back -------

  function entry(e, base) {
    const whole = `${base}/messages/${encodeURIComponent(e.recall)}`;
    const text = e.kind === "call" ? el("code", {class: "args"}, e.text) : el("pre", {class: "text"}, e.text);
    return el("li", {class: `entry ${e.kind}${e.error ? " failed" : ""}`, "data-kind": e.kind, "data-recall": e.recall},
      el("div", {class: "heading"}, el("b", {}, e.heading), " ", when(e.at),
        e.pending ? [" ", badge("waiting for its result", "warn")] : null),
      e.text ? text : null,
      e.more ? el("div", {class: "more"}, `… ${e.more} `,
        el("a", {href: whole, target: "_blank", title: "the whole text"}, `(recall ${e.recall})`)) : null);
  }

  function round(r, base, last) {
    const what = [`Round ${r.number}`, " · ", badge(r.outcome || "–"), ` · woken by ${r.woken_by}, ${r.slot} slot · `,
      `${num(r.model_calls)} model calls · `, when(r.started), " ", el("code", {class: "quiet"}, r.id)];
    // Open by default: a running round and the latest one (what was opened or closed stays so).
    return el("details", {class: "card round", "data-key": `round:${r.id}`, "data-round": r.id, open: r.running || last},
      el("summary", {}, what),
      r.entries.length ? el("ol", {class: "entries"}, r.entries.map((e) => entry(e, base)))
        : el("p", {class: "quiet"}, r.running ? "Nothing said yet." : "Nothing was said in this round."));
  }

  function timeline(t, base) {
    if (!t || !t.rounds.length) return el("p", {class: "quiet"}, "No rounds yet.");
    const rounds = t.rounds.map((r, i) => round(r, base, i === t.rounds.length - 1));
    if (!t.earlier) return rounds;
    return [el("p", {class: "quiet"}, `${num(t.earlier)} earlier messages are not shown.`), ...rounds];
  }

  async function revoke(device) {
    if (!window.confirm(`Revoke ${device.name}? Its connection closes now and it cannot reconnect.`)) return;
    try {
      await call(`/console/api/devices/${encodeURIComponent(device.id)}/revoke`, {});
      refresh();
    } catch (error) {
      showError(error.message);
    }
  }

  // How a device confines commands (its last Hello's line), flagged when it does not fully.
  function sandbox(v) {
    const line = v.sandbox || (v.last_seen_at ? "unknown (daemon too old)" : "–");
    if (!v.sandbox_warning) return line;
    const tone = v.sandbox_warning === "sandbox incomplete" ? "warn" : "bad";
    return [badge(v.sandbox_warning, tone), el("div", {class: "quiet"}, line)];
  }

  render.devices = (d) => {
    const flagged = d.devices.filter((v) => v.sandbox_warning && !v.revoked);
    const out = [];
    if (d.hint) out.push(el("p", {class: "note", id: "first-device-hint"}, d.hint));
    if (flagged.length) {
      out.push(el("p", {class: "note", id: "sandbox-warnings"},
        `Not fully sandboxed: ${flagged.map((v) => `${v.name} (${v.sandbox_warning})`).join("; ")}. `,
        "The sandbox is set in each device's own policy (",
        el("code", {}, "sandbox = \"required\""), " in policy.toml)."));
    }
    out.push(devicesTable(d));
    out.push(repositoriesSection(d));
    return out;
  };

  // The clones each device reported under its allowed roots (what tickets are routed by).
  function repositoriesSection(d) {
    const live = d.devices.filter((v) => !v.revoked);
    const rows = live.flatMap((v) => (v.repositories || []).map((r) => ({...r, device: v.name})));
    const silent = live.filter((v) => !v.repositories_reported_at).map((v) => v.name);
    const cut = live.filter((v) => v.repositories_truncated).map((v) => v.name);
    return el("section", {id: "repositories"}, section("Repositories",
      table([
        {h: "Device", f: (r) => r.device},
        {h: "Repository", f: (r) => r.owner_name || "–"},
        {h: "Default branch", f: (r) => r.default_branch || "–"},
        {h: "Path", f: (r) => el("code", {}, r.path)},
        {h: "Remote", f: (r) => r.remote || "–"},
        {h: "Reported", f: (r) => when(r.reported_at)},
      ], rows, "No device has reported a repository."),
      silent.length ? el("p", {class: "quiet"}, `Not reported by ${silent.join(", ")} (endpointd there predates the report, or has not connected since).`) : null,
      cut.length ? el("p", {class: "quiet"}, `The scan of ${cut.join(", ")} stopped at its bounds: there may be more.`) : null));
  }

  const devicesTable = (d) => table([
    {h: "Name", f: (v) => v.name},
    {h: "Status", f: (v) => badge(v.revoked ? "revoked" : v.online ? "online" : "offline")},
    {h: "Owner", f: (v) => v.owner || "–"},
    {h: "Shared with", f: (v) => (v.shares && v.shares.length ? v.shares.join(", ") : "–")},
    {h: "Last seen", f: (v) => when(v.last_seen_at)},
    {h: "Queue", f: (v) => [num(v.queue_depth), v.oldest_queued ? el("div", {class: "quiet"}, "oldest ", when(v.oldest_queued)) : null], num: true},
    {h: "Policy hash", f: (v) => (v.policy_hash ? el("code", {title: `${v.policy_hash} (of the policy file and the sandbox mode in effect)`}, v.policy_hash.slice(0, 12)) : "–")},
    {h: "Sandbox", f: sandbox},
    {h: "Version", f: (v) => v.version || "–"},
    {h: "ID", f: (v) => el("code", {}, v.id)},
    {h: "", f: (v) => (v.revoked ? "" : el("button", {type: "button", class: "danger", onclick: () => revoke(v)}, "Revoke"))},
  ], d.devices, "No devices yet: pair one above.");

  render.triggers = (d) => [table([
    {h: "When", f: (t) => when(t.created_at)},
    {h: "Source", f: (t) => t.source},
    {h: "Kind", f: (t) => t.kind},
    {h: "From", f: (t) => [t.actor_name, t.actor_is_bot ? [" ", badge("bot")] : ""]},
    {h: "Verdict", f: (t) => [badge(t.verdict || "–"), el("div", {class: "quiet"}, t.verdict_reason || "")]},
    {h: "Route", f: (t) => [badge(t.route || "–"), t.route === "router" && !t.routed_at ? el("div", {class: "quiet"}, "waiting") : null]},
    {h: "Thread", f: (t) => link(t.thread_url, t.thread_title || t.thread)},
    {h: "Text", f: (t) => t.text + (t.cut ? " …" : "")},
    {h: "Router", f: routerSaid},
  ], d.triggers, "No events match.")];

  // What the router decided about an event, and each call its turns made (refused ones
  // with why): a request the model kept failing on is visible, not silent.
  function routerSaid(t) {
    const out = [];
    if (t.undecidable_at) out.push(badge("set aside"), el("div", {class: "quiet"}, t.route_error || ""));
    else if (t.route_attempts) out.push(badge(`failing (${t.route_attempts})`), el("div", {class: "quiet"}, t.route_error || ""));
    if (t.decision) out.push(el("div", {}, t.decision));
    if (t.calls && t.calls.length) {
      out.push(el("details", {"data-key": `calls:${t.id}`},
        el("summary", {}, `${t.calls.length} call(s), ${t.calls.filter((c) => !c.ok).length} refused`),
        el("ul", {}, t.calls.map((c) => el("li", {}, c.ok ? "" : [badge("refused"), " "], el("code", {}, c.tool), " ", c.outcome)))));
    }
    return out;
  }

  const spend = [
    {h: "Calls", f: (r) => num(r.calls), num: true},
    {h: "Errors", f: (r) => num(r.errors), num: true},
    {h: "Prompt tokens", f: (r) => num(r.prompt_tokens), num: true},
    {h: "Cached", f: (r) => num(r.cached_tokens), num: true},
    {h: "Cache hits", f: (r) => pct(r.cache_hit_rate), num: true},
    {h: "Completion tokens", f: (r) => num(r.completion_tokens), num: true},
    {h: "Cost", f: (r) => usd(r.cost_usd), num: true},
  ];

  render.costs = (d) => [
    el("p", {class: "quiet"}, `Model calls of the last ${d.days_covered} days (UTC days).`),
    table([{h: "", f: () => "Total"}, ...spend], [d.total], ""),
    ...section("Per day", table([{h: "Day", f: (r) => r.day}, ...spend], d.per_day, "No model calls yet.")),
    ...section("Per ticket", table([
      {h: "Ticket", f: (r) => (r.ticket_id ? ticketLink(r.ticket_id) : el("i", {}, r.session_kind))},
      {h: "Title", f: (r) => r.title || ""},
      {h: "State", f: (r) => (r.state ? badge(r.state) : "")},
      ...spend,
    ], d.per_ticket, "No model calls yet.")),
  ];

  function documentCard(kind, doc) {
    const show = (body) => el("pre", {class: "body"}, typeof body === "string" ? body : JSON.stringify(body, null, 2));
    const parts = [el("h3", {}, doc.name, " ", el("span", {class: "quiet"},
      doc.count ? `${doc.count} version${doc.count === 1 ? "" : "s"}` : "built-in default"))];
    if (doc.default !== null && doc.default !== undefined) {
      parts.push(el("details", {"data-key": `${kind}:${doc.name}:default`}, el("summary", {}, "The built-in default (no saved version)"), show(doc.default)));
    }
    for (const v of doc.versions) {
      parts.push(el("details", {"data-key": `${kind}:${v.id}`},
        el("summary", {}, `v${v.version}`, " · ", v.author, " · ", when(v.created_at), " · ", el("code", {}, v.id),
          v.base_id ? ` (based on ${v.base_id})` : ""),
        show(v.body)));
    }
    parts.push(el("p", {class: "quiet"}, "Edit: ", el("code", {}, doc.edit)));
    return el("section", {class: "card"}, parts);
  }

  render.versions = (d) => [
    ...section("Prompts", d.prompts.map((doc) => documentCard("prompt", doc))),
    ...section("Policies", d.policies.map((doc) => documentCard("policy", doc))),
  ];

  // -- data and live updates ------------------------------------------------------------

  function toLogin() {
    location.href = `/console/login?next=${encodeURIComponent(location.pathname + location.search)}`;
  }

  async function answer(response) {
    if (response.status === 401) toLogin();
    const data = await response.json().catch(() => null);
    if (!response.ok) throw new Error(data?.error?.message || `the server answered ${response.status}`);
    return data;
  }

  const call = async (path, body) => answer(await fetch(path, {
    method: "POST", credentials: "same-origin",
    headers: {"Content-Type": "application/json", Accept: "application/json"},
    body: JSON.stringify(body),
  }));

  function showError(message) {
    const box = $("error");
    if (!box) return;
    box.textContent = message || "";
    box.hidden = !message;
  }

  function show(data) {
    const view = $("view");
    // Whatever a person opened or closed stays so; anything new comes as rendered.
    const was = new Map([...view.querySelectorAll("details[data-key]")].map((d) => [d.dataset.key, d.open]));
    view.replaceChildren(...render[page](data));
    for (const details of view.querySelectorAll("details[data-key]")) {
      if (was.has(details.dataset.key)) details.open = was.get(details.dataset.key);
    }
    // Running commands' output follows its end, as a terminal would.
    for (const pre of view.querySelectorAll("pre.output[data-live]")) pre.scrollTop = pre.scrollHeight;
  }

  const get = async (path) => answer(await fetch(path, {credentials: "same-origin", headers: {Accept: "application/json"}}));

  // The page's JSON. A ticket's timeline comes from an address of its own, fetched again
  // only when one of its topics moved: it can be long, and a command's output growing
  // (the "commands" topic, every second while one runs) does not change it.
  const TIMELINE_TOPICS = ["tickets", "transcript"];
  let timelineShown = null;
  let timelineStale = true;

  async function load() {
    if (page !== "ticket") return get(api);
    const fetchTimeline = timelineStale || !timelineShown;
    timelineStale = false;
    try {
      const [data, timeline] = await Promise.all([get(api), fetchTimeline ? get(`${api}/timeline`) : timelineShown]);
      timelineShown = timeline;
      return {...data, timeline};
    } catch (error) {
      timelineStale = true;
      throw error;
    }
  }

  let busy = false;
  let again = false;

  async function refresh() {
    if (!api || !render[page]) return;
    if (busy) { again = true; return; }
    busy = true;
    try {
      do {
        again = false;
        show(await load());
      } while (again);
      showError(null);
    } catch (error) {
      showError(error.message);
    } finally {
      busy = false;
    }
  }

  let retry = 0;

  function live(on, text) {
    const badgeEl = $("live");
    if (!badgeEl) return;
    badgeEl.className = `live ${on ? "on" : "off"}`;
    badgeEl.textContent = text;
  }

  function connect() {
    if (!topics) return;
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(`${scheme}//${location.host}/console/ws?topics=${encodeURIComponent(topics)}`);
    socket.onmessage = (event) => {
      const frame = JSON.parse(event.data);
      if (frame.type === "ready") {
        retry = 0;
        live(true, "live");
        timelineStale = true;
        refresh(); // whatever changed while connecting
      } else if (frame.type === "changed") {
        if (frame.topics.some((t) => TIMELINE_TOPICS.includes(t))) timelineStale = true;
        refresh();
      } else if (frame.type === "error") {
        showError(frame.message);
      }
    };
    socket.onclose = (event) => {
      if (event.code === 1008) { toLogin(); return; }
      const wait = Math.min(30, 2 ** retry++) * (0.8 + Math.random() * 0.4);
      live(false, `disconnected; retrying in ${Math.round(wait)}s`);
      setTimeout(connect, wait * 1000);
    };
  }

  // -- the ticket page's actions (the forms are in the page, outside the view) ----------

  const CLOSED = ["completed", "failed", "stopped"];
  let shown = null; // the ticket as last rendered

  function allow(form, ok, why) {
    form.querySelector("button").disabled = !ok;
    form.querySelector("[data-when]").textContent = ok ? "" : why;
  }

  function ticketActions(d) {
    const box = $("actions");
    if (!box) return;
    shown = d;
    box.hidden = false;
    const closed = CLOSED.includes(d.state);
    const over = `the ticket is ${d.state}`;
    allow($("retry"), d.state === "waiting_human", closed ? over : `only a ticket waiting for people retries; this one is ${d.state}`);
    const select = $("reroute").elements.device;
    const chosen = select.value;
    const others = d.paired_devices.filter((v) => v.name !== d.device);
    select.replaceChildren(...others.map((v) => el("option", {value: v.id}, v.name)));
    if (others.some((v) => v.id === chosen)) select.value = chosen;
    allow($("reroute"), !closed && others.length > 0, closed ? over : "no other paired device");
    allow($("stop"), !closed, over);
  }

  async function act(form, action, body) {
    const result = $("action-result");
    form.querySelector("button").disabled = true;
    try {
      const done = await call(`${api}/${action}`, body);
      result.className = "note";
      result.textContent = done.message;
      form.reset();
    } catch (error) {
      result.className = "error";
      result.textContent = error.message;
    }
    result.hidden = false;
    await refresh();
  }

  function onSubmit(id, handler) {
    const form = $(id);
    if (!form) return;
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      handler(form);
    });
  }

  onSubmit("retry", (form) => act(form, "retry", {note: form.elements.note.value}));
  onSubmit("reroute", (form) => {
    const select = form.elements.device;
    const name = select.selectedOptions[0]?.textContent;
    const from = shown?.device ? ` Work queued for ${shown.device} is cancelled.` : "";
    if (!name || !window.confirm(`Move ${shown.id} to ${name}?${from}`)) return;
    act(form, "reroute", {device: select.value});
  });
  onSubmit("stop", (form) => {
    if (!window.confirm(`Stop ${shown.id} for good? Its mandate is revoked and its device work cancelled.`)) return;
    act(form, "stop", {});
  });

  // -- the pair form --------------------------------------------------------------------

  const pairForm = $("pair");
  if (pairForm) {
    pairForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      const box = $("paired");
      box.hidden = false;
      const fields = new FormData(pairForm);
      try {
        const issued = await call("/console/api/devices/pair", {name: fields.get("name"), owner: fields.get("owner"), shared: fields.get("shared")});
        box.replaceChildren(
          el("p", {}, `Pairing code for ${issued.device_name}: `, el("span", {class: "code"}, issued.code),
            ` (single use, until ${new Date(issued.expires_at).toLocaleTimeString()})`),
          el("p", {}, "On the device, run:"),
          el("pre", {}, issued.command));
        pairForm.reset();
      } catch (error) {
        box.replaceChildren(el("p", {class: "error"}, error.message));
      }
    });
  }

  refresh();
  connect();
})();
