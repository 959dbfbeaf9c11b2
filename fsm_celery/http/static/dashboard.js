// The dashboard's pages, live: one EventSource on /api/events moves rows, badges, the graph
// and the timeline as transitions commit; admins' buttons ask for confirmation (and a reason)
// and send the action to /api with the session's CSRF token.
"use strict";

const csrf = () => document.querySelector('meta[name="csrf-token"]').content;
const isAdmin = () => document.body.dataset.admin === "true";
const time = (iso) => new Date(iso).toISOString().slice(11, 19);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

// What an operator may do in each status (core/admin.py decides; the page is given it).
const commandsOf = (status) => JSON.parse(document.body.dataset.commands || "{}")[status] || [];

// As pages.py's `duration`: 850 ms, 8.4 s, 6 min 2 s, 5 min, 3 h 5 min, 2 d 4 h.
function duration(ms) {
  if (ms < 1000) return `${ms} ms`;
  if (ms < 59950) {
    const tenths = Math.floor((ms + 50) / 100);
    return `${Math.floor(tenths / 10)}.${tenths % 10} s`;
  }
  const s = Math.floor((ms + 500) / 1000);
  const two = (big, unit, small, smaller) => (small ? `${big} ${unit} ${small} ${smaller}` : `${big} ${unit}`);
  if (s >= 86400) return two(Math.floor(s / 86400), "d", Math.floor((s % 86400) / 3600), "h");
  if (s >= 3600) return two(Math.floor(s / 3600), "h", Math.floor((s % 3600) / 60), "min");
  return two(Math.floor(s / 60), "min", s % 60, "s");
}

// As pages.py's `retries_text`: the retries a state has used, of those it allows.
function retriesText(used, allowed) {
  if (allowed === null || allowed === undefined) return "—";
  if (allowed === 0) return "no retries";
  if (used === 0) return `first try (up to ${allowed} retries)`;
  return `retry ${used} of ${allowed}`;
}

function badge(status) {
  return el("span", { class: `badge status-${status}` }, status);
}

async function send(method, url, body) {
  const response = await fetch(url, {
    method,
    headers: { "content-type": "application/json", "x-csrf-token": csrf() },
    body: JSON.stringify(body),
    credentials: "same-origin",
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error ? data.error.message : response.statusText);
  return data;
}

// -- confirmation dialog ----------------------------------------------------------------

function confirmAction({ title, text, fields, run }) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  const holder = document.getElementById("confirm-fields");
  holder.replaceChildren(...(fields || []));
  const reason = document.getElementById("confirm-reason");
  reason.value = "";
  const error = document.getElementById("confirm-error");
  error.hidden = true;
  const form = document.getElementById("confirm-form");
  form.onsubmit = async (event) => {
    event.preventDefault();
    try {
      await run(reason.value, form);
      dialog.close();
    } catch (exc) {
      error.textContent = exc.message;
      error.hidden = false;
    }
  };
  document.getElementById("confirm-cancel").onclick = () => dialog.close();
  dialog.showModal();
}

// -- one machine's page -------------------------------------------------------------------

function machinePage(section) {
  const id = section.dataset.machine;
  const graphBox = document.getElementById("graph");
  const drawing = JSON.parse(graphBox.dataset.drawing);
  const graph = new MachineGraph(graphBox, drawing);
  const visited = drawing.visited.slice();

  const retries = JSON.parse(section.dataset.retries || "{}");

  if (isAdmin()) wireActions(id);
  if (isAdmin()) wireTravel(id);
  const gate = document.getElementById("decide");
  if (gate) wireDecision(id, gate);
  const family = document.getElementById("family");
  const refresh = family ? familyRefresher(id, family, graph) : () => {};
  const timeline = document.getElementById("timeline");
  // a step once (by its attempt); an answer refused is no step, but each refusal once
  const stepKey = (attempt, event, at) => (event === "refused" ? `${attempt} refused ${Date.parse(at)}` : `${attempt}`);
  const shown = new Set(Array.from(timeline.querySelectorAll("li[data-attempt]"), (li) =>
    stepKey(li.dataset.attempt, li.dataset.event, li.querySelector("time")?.getAttribute("datetime"))));
  let step = Number(document.getElementById("m-step").textContent);  // the machine's, as shown

  const showMachine = (state, status, attempt, stateRetries) => {
    if (attempt < step) return;  // older than what is shown (an event overtaken by a read)
    step = attempt;
    document.getElementById("m-state").textContent = state;
    document.getElementById("m-step").textContent = attempt;
    document.getElementById("m-retries").textContent = retriesText(stateRetries, retries[state]);
    const badgeNow = document.getElementById("m-status");
    badgeNow.replaceWith(Object.assign(badge(status), { id: "m-status" }));
    showCommands(status);
    // as pages.py's `deadline_text`; a running machine's new deadline comes with a read
    if (status !== "running") document.getElementById("m-deadline").textContent = status === "paused" ? "none while paused" : "—";
    graph.update(state, status, visited);
  };

  // A step in its place in the timeline (newest first), once.
  const showStep = (item) => {
    const key = stepKey(item.attempt, item.event, item.at);
    if (shown.has(key)) return;
    shown.add(key);
    if (item.fromState && item.event !== "refused") visited.push([item.fromState, item.toState]);
    const older = [...timeline.children].find((li) => Number(li.dataset.attempt) < item.attempt);
    timeline.insertBefore(historyItem(item), older ?? null);
    // the gate this page shows was decided, or left: the page as it is now
    if (gate && item.attempt >= Number(gate.dataset.attempt)) location.reload();
  };

  const handle = (event) => {
    if (event.parentId === id) refresh();  // a child started or moved
    if (event.machineId !== id) return;
    refresh();  // a fan-out opened, or joined
    showStep(event);
    // the attempt the event ended; a refusal ends none (the machine is still at it)
    const now = event.event === "refused" ? event.attempt : event.attempt + 1;
    showMachine(event.toState, event.status, now, event.stateRetries);
  };

  // Subscribed (at the start, and again after a reconnection): what the machine did between
  // this page's reading and its subscription, or while its feed was cut off, came in no event;
  // it is read, and shown as the events would have shown it. (Steps read here may arrive as
  // events too, and an event may be older than the machine read: each is shown once, and the
  // newest machine wins.)
  const caughtUp = async () => {
    const response = await fetch(`/api/machines/${id}`, { credentials: "same-origin" });
    if (!response.ok) return;  // no telling: go on live
    const { machine, history } = await response.json();
    for (const h of history) {
      showStep({
        at: h.created_at, attempt: h.attempt, event: h.event, fromState: h.from_state,
        toState: h.to_state, durationMs: h.duration_ms, actor: h.actor, success: h.success,
        error: h.error_message,
      });
    }
    showMachine(machine.current_state, machine.status, machine.attempt, machine.state_retries);
    if (machine.status === "running" && machine.deadline_at) {
      document.getElementById("m-deadline").textContent = machine.deadline_at.slice(0, 19).replace("T", " ");
    }
  };

  return { handle, caughtUp };
}

// -- rewind and fork from a step of the timeline -----------------------------------------

function wireTravel(id) {
  document.getElementById("timeline").addEventListener("click", async (click) => {
    const button = click.target.closest("[data-travel]");
    if (!button) return;
    const { travel, step, state } = button.dataset;
    const preview = el("pre", { class: "context", id: "travel-context" }, "…");
    const edits = el("textarea", { name: "edits", id: "travel-edits", placeholder: '{"key": "value"}' });
    confirmAction({
      title: travel === "rewind" ? `Rewind to step ${step} (${state})?` : `Fork from step ${step} (${state})?`,
      text: travel === "rewind"
        ? "The machine goes back to this state with the context below (and your edits), as a new attempt; its attempt in flight is cancelled."
        : "A new machine starts in this state with the context below (and your edits); this one is untouched.",
      fields: [el("label", {}, "Context after this step", preview), el("label", {}, "Edits (a JSON object)", edits)],
      run: async (reason) => {
        let set = {};
        if (edits.value.trim()) {
          try { set = JSON.parse(edits.value); } catch (bad) { throw new Error(`edits: ${bad.message}`); }
        }
        const done = await send("POST", `/api/machines/${id}/${travel}`, { step: Number(step), set, reason });
        if (travel === "fork") location.assign(`/machines/${done.machine.id}`);
        else location.reload();
      },
    });
    const response = await fetch(`/api/machines/${id}/context?step=${step}`, { credentials: "same-origin" });
    const found = await response.json().catch(() => ({}));
    preview.textContent = JSON.stringify(found.context, null, 2);
  });
}

// -- a decision at an approval gate ------------------------------------------------------

function formValue(input) {
  if (input.dataset.type === "boolean") return input.checked;
  if (input.value === "") return undefined;
  if (input.dataset.type === "integer") return parseInt(input.value, 10);
  if (input.dataset.type === "number") return Number(input.value);
  return input.value;
}

function wireDecision(id, gate) {
  const form = document.getElementById("decision");
  if (!form) return;
  const error = document.getElementById("decision-error");
  form.addEventListener("submit", async (submit) => {
    submit.preventDefault();
    const decision = submit.submitter ? submit.submitter.value : "approve";
    const fields = {};
    for (const input of form.querySelectorAll("[data-type]")) {
      const value = formValue(input);
      if (value !== undefined) fields[input.name] = value;
    }
    const body = {
      decision, fields, comment: form.elements.__comment.value, attempt: Number(gate.dataset.attempt),
    };
    for (const button of form.querySelectorAll("button")) button.disabled = true;
    try {
      await send("POST", `/api/machines/${id}/decisions`, body);
      location.reload();
    } catch (failed) {
      error.textContent = failed.message;
      error.hidden = false;
      for (const button of form.querySelectorAll("button")) button.disabled = false;
    }
  });
}

// The children panel and the graph's fan-out marks, read again at most once a second while
// children move: a map of 10,000 items sends many events, the page asks for one small read.
function familyRefresher(id, family, graph) {
  const shown = Number(family.dataset.shown);
  let timer = null;
  const read = async () => {
    timer = null;
    const get = async (url) => {
      const response = await fetch(url, { credentials: "same-origin" });
      if (!response.ok) throw new Error(response.statusText);
      return response.json();
    };
    const [tree, fanOuts] = await Promise.all([
      get(`/api/machines/${id}/tree?shown=${shown}&most=${shown + 1}`),
      get(`/api/machines/${id}/fan-outs`),
    ]);
    showChildren(tree.tree);
    showFanOuts(fanOuts.items);
    const latest = {};
    for (const f of fanOuts.items) latest[f.state] ??= f;  // newest first
    graph.setCounts(latest);
    graph.setChildren(tree.tree.children);
  };
  return () => {
    if (timer === null) timer = setTimeout(() => read().catch(() => {}), 1000);
  };
}

const number = (n) => n.toLocaleString("en");

// As views.py's `more_text`: "… 9,990 more: 9,000 completed, 12 failed, 978 running".
function moreText(more) {
  const total = Object.values(more).reduce((sum, n) => sum + n, 0);
  if (!total) return "";
  return `… ${number(total)} more: ${Object.entries(more).map(([s, n]) => `${number(n)} ${s}`).join(", ")}`;
}

function showChildren(tree) {
  const rows = tree.children.map((c) => el("tr", { "data-machine": c.id },
    el("td", {}, c.branch ?? ""),
    el("td", { class: "mono" }, el("a", { href: `/machines/${c.id}` }, c.id.slice(0, 8))),
    el("td", {}, c.type), el("td", { class: "state" }, c.current_state),
    el("td", { class: "status" }, badge(c.status))));
  if (!rows.length) rows.push(el("tr", { class: "empty" }, el("td", { colspan: 5, class: "muted" }, "No child yet.")));
  document.querySelector("#children tbody").replaceChildren(...rows);
  document.getElementById("children-more").textContent = moreText(tree.more);
}

function showFanOuts(items) {
  const rows = items.map((f) => el("tr", { "data-state": f.state, "data-attempt": f.attempt },
    el("td", {}, f.state), el("td", {}, f.attempt), el("td", {}, f.kind), el("td", {}, f.total),
    el("td", { class: "done" }, f.done), el("td", { class: "failed" }, f.failed),
    el("td", { class: "running" }, f.running), el("td", { class: "waiting" }, f.waiting),
    el("td", { class: "cancelled" }, f.cancelled), el("td", {}, f.verdict)));
  if (!rows.length) rows.push(el("tr", { class: "empty" }, el("td", { colspan: 10, class: "muted" }, "No fan-out yet.")));
  document.querySelector("#fan-outs tbody").replaceChildren(...rows);
}

// One timeline item, as the page renders a history row.
function historyItem(event) {
  const line = el("div", { class: "line" },
    el("time", { datetime: event.at }, time(event.at)), " ",
    el("b", { title: `step ${event.attempt}` }, `#${event.attempt} ${event.event}`), " ",
    event.fromState ? `${event.fromState} → ` : "", el("b", {}, event.toState),
    event.durationMs !== null && event.durationMs !== undefined
      ? el("span", { class: "muted duration", title: `${event.durationMs} ms` }, ` ${duration(event.durationMs)}`) : "",
    event.actor ? el("span", { class: "muted" }, ` by ${event.actor}`) : "");
  const item = el("li", { class: `event ev-${event.event} ${event.success ? "ok" : "failed"} new`, "data-attempt": event.attempt, "data-event": event.event }, line);
  if (event.error) item.append(el("div", { class: "error" }, event.error));
  return item;
}

// Only the buttons of what the machine's status allows are shown.
function showCommands(status) {
  const allowed = commandsOf(status);
  for (const button of document.querySelectorAll("#actions [data-action]")) {
    button.hidden = !allowed.includes(button.dataset.action);
  }
}

function wireActions(id) {
  const box = document.getElementById("actions");
  const states = JSON.parse(box.dataset.states);
  box.addEventListener("click", (click) => {
    const action = click.target.dataset.action;
    if (!action) return;
    const fields = [];
    if (action === "force") {
      const select = el("select", { name: "state", id: "confirm-state" },
        ...states.map((s) => el("option", { value: s }, s)));
      fields.push(el("label", {}, "State ", select));
    }
    if (action === "budget") {
      fields.push(el("label", {}, "Tokens ", el("input", { name: "tokens", inputmode: "numeric", placeholder: "no limit" })));
      fields.push(el("label", {}, "Cost ", el("input", { name: "cost", inputmode: "decimal", placeholder: "no limit" })));
    }
    confirmAction({
      title: `${action[0].toUpperCase()}${action.slice(1)} this machine?`,
      text: `It is recorded in the history, with your name and reason.`,
      fields,
      run: async (reason, form) => {
        if (action === "budget") {
          const number = (name) => (form.elements[name].value === "" ? null : Number(form.elements[name].value));
          await send("PUT", `/api/machines/${id}/budget`, { tokens: number("tokens"), cost: number("cost"), reason });
          location.reload();
          return;
        }
        const body = { reason };
        if (action === "force") body.state = form.elements.state.value;
        await send("POST", `/api/machines/${id}/${action}`, body);
      },
    });
  });
}

// -- the machines list ----------------------------------------------------------------------

// An admin revokes an agent's Redis credentials from the agents' table.
function wireRevoke() {
  const box = document.getElementById("agents");
  if (!box) return;
  box.addEventListener("click", (click) => {
    const id = click.target.dataset.revoke;
    if (!id) return;
    confirmAction({
      title: `Revoke agent ${id.slice(0, 8)}'s credentials?`,
      text: "Its Redis user is deleted and its connections closed; recorded with your name and reason.",
      run: async (reason) => {
        await send("POST", `/api/agents/${id}/revoke`, { reason });
        location.reload();
      },
    });
  });
}

function machinesPage(table) {
  const filters = JSON.parse(table.dataset.filters || "{}");
  const roots = table.dataset.roots === "true";  // no child listed (pages.py)
  const body = table.tBodies[0];
  const matches = (event) =>
    (!roots || !event.parentId) &&
    (!filters.status || filters.status === event.status) &&
    (!filters.type || filters.type === event.machineType) &&
    (!filters.agent_type || filters.agent_type === event.agentType) &&
    (!filters.parent || filters.parent === event.parentId) &&
    !filters.github_issue && !filters.agent_id && !filters.created_before && !filters.cursor;

  if (isAdmin()) wireBulk(roots ? { ...filters, roots: true } : filters);
  if (isAdmin()) wireRevoke();

  const handle = (event) => {
    let row = body.querySelector(`tr[data-machine="${event.machineId}"]`);
    if (!row && event.event === "start" && matches(event)) {
      body.querySelector("tr.empty")?.remove();
      row = el("tr", { "data-machine": event.machineId, "data-type": event.machineType },
        el("td", { class: "mono" }, el("a", { href: `/machines/${event.machineId}` }, event.machineId.slice(0, 8))),
        el("td", {}, event.machineType), el("td", { class: "state" }), el("td", { class: "status" }),
        el("td", { class: "step" }), el("td", {}, event.githubIssue ?? ""), el("td", {}, el("time", { datetime: event.at }, event.at.slice(0, 19).replace("T", " "))),
        el("td", { class: "updated" }));
      body.prepend(row);
    }
    if (row) showRow(row, event.toState, event.status, event.attempt + 1, event.at);  // every move opens the next step
    updateAgent(event);
  };

  // Subscribed (at the start, and after a reconnection): the rows as the machines are now,
  // for what moved between the page's reading and its subscription (in no event it received).
  const caughtUp = async () => {
    const shown = body.querySelectorAll("tr[data-machine]").length;
    if (!shown) return;
    const query = new URLSearchParams(location.search);
    query.set("limit", String(Math.min(shown, 500)));
    if (roots) query.set("roots", "true");
    const response = await fetch(`/api/machines?${query}`, { credentials: "same-origin" });
    if (!response.ok) return;  // no telling: go on live
    for (const m of (await response.json()).items) {
      const row = body.querySelector(`tr[data-machine="${m.id}"]`);
      if (row) showRow(row, m.current_state, m.status, m.attempt, m.updated_at);
    }
  };
  return { handle, caughtUp };
}

// A row of the list as its machine is at this step, unless it shows a later one already.
function showRow(row, state, status, step, at) {
  const cell = row.querySelector(".step");
  if (cell.textContent !== "" && step < Number(cell.textContent)) return;
  const same = cell.textContent === String(step) && row.querySelector(".state").textContent === state &&
    row.querySelector(".status").textContent.trim() === status;
  if (same) return;
  row.querySelector(".state").textContent = state;
  row.querySelector(".status").replaceChildren(badge(status));
  cell.textContent = step;
  row.querySelector(".updated").replaceChildren(el("time", { datetime: at }, time(at)));
  row.classList.remove("flash");
  void row.offsetWidth;
  row.classList.add("flash");
}

// What the list page asks the feed for: the machines it shows, and the machines that start from
// now on when its filters would show them (they are then followed too).
function machinesInterest(table) {
  const filters = JSON.parse(table.dataset.filters || "{}");
  const query = new URLSearchParams();
  const shown = [...table.querySelectorAll("tr[data-machine]")].map((row) => row.dataset.machine);
  const worked = [...document.querySelectorAll("[data-work]")].map((link) => link.dataset.work);
  for (const id of new Set([...shown, ...worked])) query.append("machine_id", id);
  const showsNew = (!filters.status || filters.status === "running") && !filters.cursor &&
    !filters.github_issue && !filters.agent_id && !filters.created_before;
  if (showsNew && filters.parent) {
    query.append("parent_id", filters.parent);  // its children, those to start among them
  } else if (showsNew) {
    query.set("starts", "true");
    if (filters.type) query.set("type", filters.type);
    if (filters.agent_type) query.set("agent_type", filters.agent_type);
  }
  return query;
}

function updateAgent(event) {
  if (!event.agentId) return;
  const cell = document.querySelector(`tr[data-agent="${event.agentId}"] .work`);
  if (!cell) return;
  const list = cell.querySelector(".work-list");
  list.querySelector(`[data-work="${event.machineId}"]`)?.remove();
  if (event.status === "running" || event.status === "paused") {
    list.querySelector(".idle")?.remove();
    list.prepend(el("li", { "data-work": event.machineId },
      el("a", { href: `/machines/${event.machineId}` }, `${event.machineType} · `, el("b", {}, event.toState)),
      " ", el("span", { class: "mono muted" }, event.machineId.slice(0, 8))));
  } else if (!list.querySelector("[data-work]")) {
    list.replaceChildren(el("li", { class: "muted idle" }, "idle"));
  }
}

function wireBulk(filters) {
  for (const button of document.querySelectorAll("[data-bulk]")) {
    button.addEventListener("click", async () => {
      const action = button.dataset.bulk;
      const query = new URLSearchParams(bulkFilter(filters));
      let text;
      try {
        const response = await fetch(`/api/machines/count?${query}`, { credentials: "same-origin" });
        const counted = await response.json();
        if (!response.ok) throw new Error(counted.error ? counted.error.message : response.statusText);
        text = bulkText(action, filters, counted);
      } catch (exc) {
        text = `The machines could not be counted (${exc.message}).`;
      }
      confirmAction({
        title: `${action[0].toUpperCase()}${action.slice(1)} all matching machines?`,
        text,
        run: async (reason) => {
          const filter = bulkFilter(filters);
          if (filter.github_issue) filter.github_issue = Number(filter.github_issue);
          const result = await send("POST", "/api/machines/bulk", { action, filter, reason, limit: BULK_LIMIT });
          alert(`${result.done} done, ${result.refused} refused`);
        },
      });
    });
  }
}

const BULK_LIMIT = 1000;  // the API's most machines in one bulk command

function bulkFilter(filters) {
  const filter = {};
  for (const key of ["status", "type", "agent_type", "agent_id", "github_issue", "parent", "roots"]) {
    if (filters[key]) filter[key] = filters[key];
  }
  return filter;
}

// What the dialog says: how many machines the filter matches, and how many of them the action
// takes (the others' status refuses it).
function bulkText(action, filters, counted) {
  const described = Object.entries(filters).filter(([k]) => k !== "cursor" && k !== "roots").map(([k, v]) => `${k}=${v}`).join(", ") || "any";
  const number = (n) => n.toLocaleString("en");
  const total = counted.total;
  const taking = Object.entries(counted.by_status)
    .filter(([status]) => commandsOf(status).includes(action))
    .reduce((sum, [, n]) => sum + n, 0);
  const noun = (n) => (n === 1 ? "machine matches" : "machines match");
  let text = `${number(total)} ${noun(total)} (${described}); ${number(taking)} of them can be ${done(action)}.`;
  if (total > BULK_LIMIT) text += ` This acts on the newest ${number(BULK_LIMIT)} of them only.`;
  return text;
}

const done = (action) => ({ pause: "paused", resume: "resumed", cancel: "cancelled", retry: "retried" })[action] || action;

// -- the live feed --------------------------------------------------------------------------

// `caughtUp`, once subscribed (at the start, and again after a reconnection): it shows what
// the page missed meanwhile; the page counts as live once it did.
function listen(handle, query, caughtUp = async () => {}) {
  const live = document.getElementById("live");
  const source = new EventSource(`/api/events?${query}`, { withCredentials: true });
  source.addEventListener("hello", async () => {
    await caughtUp();
    live.classList.add("on");
  });
  source.addEventListener("transitions", (message) => JSON.parse(message.data).forEach(handle));
  source.addEventListener("resync", () => location.reload());
  source.onerror = () => live.classList.remove("on");
}

document.addEventListener("DOMContentLoaded", () => {
  const machine = document.getElementById("machine");
  if (machine) {
    const id = machine.dataset.machine;
    const page = machinePage(machine);
    listen(page.handle, new URLSearchParams({ machine_id: id, parent_id: id }), page.caughtUp);
    return;
  }
  const table = document.getElementById("machines");
  if (table) {
    const page = machinesPage(table);
    listen(page.handle, machinesInterest(table), page.caughtUp);
  }
  const graphBox = document.getElementById("graph");
  if (graphBox) new MachineGraph(graphBox, JSON.parse(graphBox.dataset.drawing));
});
