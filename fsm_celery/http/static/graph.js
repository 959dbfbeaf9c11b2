// Draws a machine definition as SVG: dagre lays the states and edges out (no coordinates are
// placed by hand), this script only turns its layout into shapes. Marks the current state and
// the edges a machine took; `update` moves them as transitions arrive.
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

class MachineGraph {
  constructor(container, drawing) {
    this.container = container;
    this.drawing = drawing;
    this.nodes = new Map();
    this.edges = [];
    this.render();
    this.update(drawing.current, drawing.status, drawing.visited || []);
  }

  render() {
    const { nodes, links } = this.drawing.graph;
    const g = new dagre.graphlib.Graph({ multigraph: true });
    g.setGraph({ rankdir: "TB", nodesep: 36, ranksep: 46, edgesep: 14, marginx: 12, marginy: 12 });
    g.setDefaultEdgeLabel(() => ({}));
    const font = "13px system-ui, sans-serif";
    for (const n of nodes) {
      g.setNode(n.id, { label: n.id, width: textWidth(n.id, font) + 28, height: 34, data: n });
    }
    links.forEach((l, i) => {
      const label = l.kind === "failure" ? "" : l.label;
      const width = label ? textWidth(label, "11px system-ui, sans-serif") + 8 : 0;
      g.setEdge(l.source, l.target, { label, width, height: label ? 14 : 0, data: l }, "e" + i);
    });
    dagre.layout(g);
    const { width, height } = g.graph();
    const svg = svgEl("svg", {
      viewBox: `0 0 ${Math.ceil(width)} ${Math.ceil(height)}`,
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
      this.edges.push({ source: e.v, target: e.w, group, path });
    }
    const nodeLayer = svgEl("g", { class: "nodes" }, svg);
    for (const id of g.nodes()) {
      const n = g.node(id);
      const classes = ["node"];
      if (n.data.initial) classes.push("initial");
      if (n.data.terminal) classes.push("terminal", `terminal-${n.data.terminal}`);
      const group = svgEl("g", {
        class: classes.join(" "),
        transform: `translate(${n.x - n.width / 2}, ${n.y - n.height / 2})`,
        "data-state": id,
      }, nodeLayer);
      const title = svgEl("title", {}, group);
      title.textContent = n.data.description || id;
      svgEl("rect", { width: n.width, height: n.height, rx: 8, ry: 8 }, group);
      const text = svgEl("text", { x: n.width / 2, y: n.height / 2 + 4.5 }, group);
      text.textContent = id;
      this.nodes.set(id, group);
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
}

window.MachineGraph = MachineGraph;
