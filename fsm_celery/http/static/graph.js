// Draws a machine definition as SVG: dagre lays the states and edges out (no coordinates are
// placed by hand), this script only turns its layout into shapes. Marks the current state and
// the edges a machine took; `update` moves them as transitions arrive. A parallel state is a
// cluster of its branches (each its own states, or a child machine), entered at the state's
// name and left at its join; a map state is one node with its children's counts
// (`setCounts`); `setChildren` marks where each branch's child is.
"use strict";

const SVG = "http://www.w3.org/2000/svg";

function svgEl(name, attrs, parent) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (parent) parent.appendChild(el);
  return el;
}

function textWidth(text, font) {
  const canvas = textWidth.canvas || (textWidth.canvas = document.createElement("canvas"));
  const ctx = canvas.getContext("2d");
  ctx.font = font;
  return ctx.measureText(text).width;
}

const FONT = "13px system-ui, sans-serif";
const SMALL = "11px system-ui, sans-serif";
const SEP = "\u0000";  // joins a cluster's path into a node id no state name can hold

// A map's progress as its node shows it (dashboard.js's tables say the same).
function countsText(p) {
  if (!p) return "";
  const n = (x) => x.toLocaleString("en");
  return `${n(p.done)} done · ${n(p.failed)} failed · ${n(p.running)} running · ${n(p.waiting)} waiting`;
}

// The box holding everything drawn: dagre's graph size leaves out the edges' routes, which may
// pass outside its nodes (a failure edge around the side), and a stroke and arrowhead go past
// their points, so the drawing would cut them off at its right or left.
function drawnBox(g) {
  const PAD = 8;
  let [left, top, right, bottom] = [Infinity, Infinity, -Infinity, -Infinity];
  const take = (x, y, w = 0, h = 0) => {
    left = Math.min(left, x - w / 2); right = Math.max(right, x + w / 2);
    top = Math.min(top, y - h / 2); bottom = Math.max(bottom, y + h / 2);
  };
  for (const id of g.nodes()) {
    const n = g.node(id);
    take(n.x, n.y, n.width, n.height);
  }
  for (const e of g.edges()) {
    const edge = g.edge(e);
    for (const p of edge.points) take(p.x, p.y);
    if (edge.label) take(edge.x, edge.y, edge.width, 2 * edge.height);
  }
  const x = Math.floor(left - PAD);
  const y = Math.floor(top - PAD);
  return { x, y, width: Math.ceil(right + PAD) - x, height: Math.ceil(bottom + PAD) - y };
}

class MachineGraph {
  constructor(container, drawing) {
    this.container = container;
    this.drawing = drawing;
    this.nodes = new Map();
    this.inner = new Map();  // a branch's nodes, by cluster path
    this.counts = new Map();  // a map state's counts line
    this.edges = [];
    this.render();
    this.update(drawing.current, drawing.status, drawing.visited || []);
    this.setCounts(drawing.fanOuts || {});
    this.setChildren(drawing.children || []);
  }

  // One state's node: its name, and a second line for what a fan-out state starts.
  addNode(g, id, n, label, parent) {
    const sub = n.kind === "map" ? countsText((this.drawing.fanOuts || {})[n.id]) || n.detail
      : ["machine", "approval", "wait"].includes(n.kind) ? n.detail : "";
    const width = Math.max(textWidth(label, FONT), sub ? textWidth(sub, SMALL) + 40 : 0) + 28;
    g.setNode(id, { label, sub, width, height: sub ? 48 : 34, data: n });
    if (parent) g.setParent(id, parent);
  }

  // A parallel state: a cluster holding the state's own node (where edges come in), a
  // cluster per branch, and its join (where edges go out).
  addCluster(g, n, branches, fork) {
    const cluster = `${n.id}${SEP}cluster`;
    g.setNode(cluster, { label: "", data: n });
    this.addNode(g, n.id, n, n.id, cluster);
    const join = `${n.id}${SEP}join`;
    g.setNode(join, { label: n.detail, width: textWidth(n.detail, SMALL) + 24, height: 22, data: { join: true } });
    g.setParent(join, cluster);
    for (const b of branches) {
      const box = `${n.id}${SEP}${b.name}`;
      g.setNode(box, { label: b.name, data: { branch: b.name } });
      g.setParent(box, cluster);
      if (b.machine) {
        const only = `${box}${SEP}`;
        this.addNode(g, only, { id: b.name, kind: "machine", detail: `→ ${b.machine}` }, b.name, box);
        fork(n.id, only);
        fork(only, join);
        continue;
      }
      for (const s of b.graph.nodes) {
        this.addNode(g, `${box}${SEP}${s.id}`, s, s.id, box);
        if (s.initial) fork(n.id, `${box}${SEP}${s.id}`);
        if (s.terminal) fork(`${box}${SEP}${s.id}`, join);
      }
      b.graph.links.forEach((l, i) => {
        g.setEdge(`${box}${SEP}${l.source}`, `${box}${SEP}${l.target}`, { label: "", data: l }, `${box}${SEP}e${i}`);
      });
    }
  }

  render() {
    const { nodes, links } = this.drawing.graph;
    const branches = this.drawing.graph.branches || {};
    const g = new dagre.graphlib.Graph({ multigraph: true, compound: true });
    g.setGraph({ rankdir: "TB", nodesep: 36, ranksep: 46, edgesep: 14, marginx: 12, marginy: 12 });
    g.setDefaultEdgeLabel(() => ({}));
    let forks = 0;
    const fork = (v, w) => g.setEdge(v, w, { label: "", data: { kind: "fork" } }, `fork${forks++}`);
    for (const n of nodes) {
      if (branches[n.id]) this.addCluster(g, n, branches[n.id], fork);
      else this.addNode(g, n.id, n, n.id);
    }
    links.forEach((l, i) => {
      const label = l.kind === "failure" ? "" : l.label;
      const width = label ? textWidth(label, SMALL) + 8 : 0;
      const source = branches[l.source] ? `${l.source}${SEP}join` : l.source;
      g.setEdge(source, l.target, { label, width, height: label ? 14 : 0, data: l }, "e" + i);
    });
    dagre.layout(g);
    const { x, y, width, height } = drawnBox(g);
    const svg = svgEl("svg", {
      viewBox: `${x} ${y} ${width} ${height}`,
      width: "100%",
      role: "img",
      "aria-label": "state machine graph",
    });
    svg.style.maxHeight = `${Math.max(320, Math.ceil(height))}px`;
    const defs = svgEl("defs", {}, svg);
    for (const kind of ["plain", "visited"]) {
      const marker = svgEl("marker", {
        id: `arrow-${kind}`, viewBox: "0 0 10 10", refX: 9, refY: 5,
        markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse",
      }, defs);
      svgEl("path", { d: "M 0 0 L 10 5 L 0 10 z", class: `arrowhead ${kind}` }, marker);
    }
    const clusterLayer = svgEl("g", { class: "clusters" }, svg);
    for (const id of g.nodes()) {
      if (!g.children(id).length) continue;
      const c = g.node(id);
      const group = svgEl("g", {
        class: c.data.branch ? "cluster branch" : "cluster",
        transform: `translate(${c.x - c.width / 2}, ${c.y - c.height / 2})`,
        "data-cluster": c.data.branch || c.data.id,
      }, clusterLayer);
      svgEl("rect", { width: c.width, height: c.height, rx: 10, ry: 10 }, group);
      if (c.label) svgEl("text", { x: 8, y: 13, class: "cluster-label" }, group).textContent = c.label;
    }
    const edgeLayer = svgEl("g", { class: "edges" }, svg);
    for (const e of g.edges()) {
      const edge = g.edge(e);
      const points = edge.points;
      let d = `M ${points[0].x} ${points[0].y}`;
      for (let i = 1; i < points.length; i++) d += ` L ${points[i].x} ${points[i].y}`;
      const group = svgEl("g", { class: `edge kind-${edge.data.kind}` }, edgeLayer);
      const path = svgEl("path", { d, "marker-end": "url(#arrow-plain)" }, group);
      if (edge.label) {
        const label = svgEl("text", { x: edge.x, y: edge.y + 4, class: "edge-label" }, group);
        label.textContent = edge.label;
      }
      // a parallel state's edges leave from its join: the history names the state
      const source = e.w.includes(SEP) ? e.v : edge.data.source ?? e.v;
      this.edges.push({ source, target: e.w, group, path });
    }
    const nodeLayer = svgEl("g", { class: "nodes" }, svg);
    for (const id of g.nodes()) {
      if (g.children(id).length) continue;
      const n = g.node(id);
      const classes = ["node", `kind-${n.data.kind || "task"}`];
      if (n.data.join) classes.push("join");
      if (n.data.initial) classes.push("initial");
      if (n.data.terminal) classes.push("terminal", `terminal-${n.data.terminal}`);
      const inner = id.includes(SEP);
      const group = svgEl("g", {
        class: classes.join(" "),
        transform: `translate(${n.x - n.width / 2}, ${n.y - n.height / 2})`,
        [inner ? "data-path" : "data-state"]: inner ? id.split(SEP).join("/") : id,
      }, nodeLayer);
      const title = svgEl("title", {}, group);
      title.textContent = n.data.description || n.label;
      svgEl("rect", { width: n.width, height: n.height, rx: 8, ry: 8 }, group);
      const text = svgEl("text", { x: n.width / 2, y: n.sub ? 19 : n.height / 2 + 4.5 }, group);
      text.textContent = n.label;
      if (n.sub) {
        const sub = svgEl("text", { x: n.width / 2, y: 37, class: "sub" }, group);
        sub.textContent = n.sub;
        if (n.data.kind === "map" && !inner) this.counts.set(id, sub);
      }
      if (inner) this.inner.set(id, group);
      else this.nodes.set(id, group);
    }
    this.container.replaceChildren(svg);
  }

  update(current, status, visited) {
    for (const [id, group] of this.nodes) {
      group.classList.toggle("current", id === current);
      group.classList.toggle(`status-${status}`, id === current);
    }
    const taken = new Set(visited.map(([from, to]) => `${from}\u0000${to}`));
    for (const state of visited.flat()) this.nodes.get(state)?.classList.add("visited");
    for (const edge of this.edges) {
      const on = taken.has(`${edge.source}\u0000${edge.target}`);
      edge.group.classList.toggle("visited", on);
      edge.path.setAttribute("marker-end", `url(#arrow-${on ? "visited" : "plain"})`);
    }
    this.container.dataset.current = current || "";
  }

  // Each map state's latest counts on its node ({state: fan-out progress}).
  setCounts(fanOuts) {
    for (const [state, text] of this.counts) {
      if (fanOuts[state]) text.textContent = countsText(fanOuts[state]);
    }
  }

  // Where each branch's child is: its current state in the branch's cluster (an inline
  // branch's child is of type TYPE.STATE.BRANCH), or its status on a child machine's node.
  setChildren(children) {
    for (const group of this.inner.values()) {
      for (const name of [...group.classList]) if (name === "current" || name.startsWith("status-")) group.classList.remove(name);
    }
    const branches = this.drawing.graph.branches || {};
    for (const child of children) {
      for (const [state, list] of Object.entries(branches)) {
        const b = list.find((x) => x.name === child.branch);
        if (!b) continue;
        const inline = child.type === `${this.drawing.type}.${state}.${b.name}`;
        if (!inline && child.type !== b.machine) continue;
        const id = [state, b.name, inline ? child.current_state : ""].join(SEP);
        this.inner.get(id)?.classList.add("current", `status-${child.status}`);
      }
    }
  }
}

window.MachineGraph = MachineGraph;
