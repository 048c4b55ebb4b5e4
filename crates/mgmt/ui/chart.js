// Warren management UI: SVG line charts, drawn by hand (no chart library).
//
//   const c = new LineChart({ id: 'overview-rates', series: [{ key: 'publish', label: 'Publish',
//     color: '#e6a700', dash: '6 3' }], format: v => v + '/s' });
//   parent.append(c.node);
//   c.setSpan(10 * 60 * 1000);          // the time range shown, ending at the newest sample
//   c.update([{ t: Date.now(), v: { publish: 12.5 } }, ...]);
//
// Each series has its own color and dash pattern (drawn with a marker at its newest point), so
// series with the same values stay distinguishable: the later-listed series is drawn under the
// earlier ones, and dashes let the one underneath show through. The legend's entries are
// buttons (aria-pressed) that hide or show a series; the y axis scales to the series shown.
//
// The <svg> carries data-chart (the id), data-samples (how many samples are drawn),
// data-latest-<key> (each series' latest value) and data-hidden (the hidden series' keys), so a
// test can read what is plotted.

const SVG_NS = 'http://www.w3.org/2000/svg';
const W = 640;
const H = 190;
const M = { left: 54, right: 12, top: 10, bottom: 24 };
const MIN_SPAN_MS = 60 * 1000;
/** Dash patterns, one per series in order when a series names none. */
const DASHES = ['', '7 4', '2 3', '10 3 2 3', '4 4'];

function svg(tag, attrs) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined && v !== '') el.setAttribute(k, String(v));
  return el;
}

const TICKS = 4;

/** The top of the y axis: TICKS times a "nice" step (1, 2, 2.5 or 5 times a power of ten). */
function niceMax(max) {
  if (!(max > 0)) return 1;
  const raw = max / TICKS;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw * (1 - 1e-9)) return m * p * TICKS;
  return 10 * p * TICKS;
}

/** Short axis label: 1200 -> 1.2k, 3500000 -> 3.5M. */
export function shortNumber(v) {
  const abs = Math.abs(v);
  const trim = (x) => (Math.round(x * 100) / 100).toString();
  if (abs >= 1e9) return trim(v / 1e9) + 'G';
  if (abs >= 1e6) return trim(v / 1e6) + 'M';
  if (abs >= 1e3) return trim(v / 1e3) + 'k';
  return trim(v);
}

function clock(t) {
  const d = new Date(t);
  const two = (n) => String(n).padStart(2, '0');
  return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
}

export class LineChart {
  /**
   * @param {{id: string, title?: string, series: {key: string, label: string, color: string}[],
   *          format?: (v: number) => string}} opts
   */
  constructor(opts) {
    this.id = opts.id;
    this.series = opts.series;
    this.format = opts.format || ((v) => String(v));
    this.samples = [];
    this.hover = null;
    this.span = 10 * 60 * 1000;
    this.hidden = new Set();
    this.node = document.createElement('div');
    this.node.className = 'chart';
    this.svg = svg('svg', {
      viewBox: `0 0 ${W} ${H}`, 'data-chart': this.id, 'data-samples': 0, role: 'img',
      'aria-label': opts.title || this.id,
    });
    this.legend = document.createElement('div');
    this.legend.className = 'legend';
    this.values = {};
    this.series.forEach((s, i) => {
      if (s.dash === undefined) s.dash = DASHES[i % DASHES.length];
      const item = document.createElement('button');
      item.type = 'button';
      item.className = 'legend-item';
      item.dataset.series = s.key;
      item.setAttribute('aria-pressed', 'true');
      item.title = 'Hide or show ' + s.label;
      const sw = svg('svg', { class: 'swatch', viewBox: '0 0 24 8', width: 24, height: 8, 'aria-hidden': 'true' });
      sw.append(svg('line', { x1: 0, x2: 24, y1: 4, y2: 4, stroke: s.color, 'stroke-width': 2.5, 'stroke-dasharray': s.dash }));
      const value = document.createElement('span');
      value.className = 'legend-value';
      value.dataset.series = s.key;
      value.textContent = '–';
      item.append(sw, s.label, value);
      item.addEventListener('click', () => this.toggle(s.key));
      this.legend.append(item);
      this.values[s.key] = value;
    });
    this.node.append(this.svg, this.legend);
    this.svg.addEventListener('mousemove', (e) => this.onMove(e));
    this.svg.addEventListener('mouseleave', () => { this.hover = null; this.draw(); });
  }

  /** Hides a shown series, shows a hidden one. */
  toggle(key) {
    if (this.hidden.has(key)) this.hidden.delete(key);
    else this.hidden.add(key);
    for (const b of this.legend.querySelectorAll('.legend-item')) {
      b.setAttribute('aria-pressed', String(!this.hidden.has(b.dataset.series)));
    }
    this.svg.setAttribute('data-hidden', [...this.hidden].join(' '));
    this.draw();
  }

  /** The time range shown (ms), ending at the newest sample. */
  setSpan(ms) {
    this.span = ms;
    this.svg.setAttribute('data-span', String(ms));
    this.draw();
  }

  shown() {
    return this.series.filter((s) => !this.hidden.has(s.key));
  }

  /** Redraws with `samples` ({t: ms, v: {key: number}}), oldest first. */
  update(samples) {
    this.samples = samples.slice();
    const last = this.samples[this.samples.length - 1];
    this.svg.setAttribute('data-samples', String(this.samples.length));
    for (const s of this.series) {
      const v = last ? last.v[s.key] : undefined;
      if (typeof v === 'number') this.svg.setAttribute(`data-latest-${s.key}`, String(v));
      else this.svg.removeAttribute(`data-latest-${s.key}`);
    }
    this.draw();
  }

  /** The samples inside the time range. */
  visible() {
    const n = this.samples.length;
    if (!n) return [];
    const from = this.samples[n - 1].t - this.span;
    return this.samples.filter((p) => p.t >= from);
  }

  range() {
    const samples = this.visible();
    const n = samples.length;
    const t1 = n ? samples[n - 1].t : Date.now();
    let t0 = n ? samples[0].t : t1 - MIN_SPAN_MS;
    if (t1 - t0 < MIN_SPAN_MS) t0 = t1 - MIN_SPAN_MS;
    let max = 0;
    for (const p of samples) {
      for (const s of this.shown()) {
        const v = p.v[s.key];
        if (typeof v === 'number' && v > max) max = v;
      }
    }
    return { t0, t1, ymax: niceMax(max) };
  }

  onMove(e) {
    const samples = this.visible();
    if (!samples.length) return;
    const box = this.svg.getBoundingClientRect();
    const x = ((e.clientX - box.left) / box.width) * W;
    const { t0, t1 } = this.range();
    const t = t0 + ((x - M.left) / (W - M.left - M.right)) * (t1 - t0);
    let best = 0;
    for (let i = 1; i < samples.length; i++) {
      if (Math.abs(samples[i].t - t) < Math.abs(samples[best].t - t)) best = i;
    }
    if (this.hover !== best) { this.hover = best; this.draw(); }
  }

  draw() {
    const { t0, t1, ymax } = this.range();
    const samples = this.visible();
    const pw = W - M.left - M.right;
    const ph = H - M.top - M.bottom;
    const X = (t) => M.left + ((t - t0) / (t1 - t0)) * pw;
    const Y = (v) => M.top + ph - (Math.max(0, v) / ymax) * ph;
    const parts = [];

    for (let i = 0; i <= TICKS; i++) {
      const v = (ymax * i) / TICKS;
      const y = Y(v);
      parts.push(svg('line', { class: i ? 'grid' : 'axis', x1: M.left, x2: W - M.right, y1: y, y2: y }));
      const label = svg('text', { x: M.left - 6, y: y + 3.5, 'text-anchor': 'end' });
      label.textContent = shortNumber(v);
      parts.push(label);
    }
    for (let i = 0; i <= 3; i++) {
      const t = t0 + ((t1 - t0) * i) / 3;
      const anchor = i === 0 ? 'start' : i === 3 ? 'end' : 'middle';
      const label = svg('text', { x: X(t), y: H - 6, 'text-anchor': anchor });
      label.textContent = clock(t);
      parts.push(label);
    }

    if (!samples.length) {
      const t = svg('text', { class: 'nodata', x: M.left + pw / 2, y: M.top + ph / 2, 'text-anchor': 'middle' });
      t.textContent = 'Waiting for data…';
      parts.push(t);
    }
    // The first series is drawn last, on top.
    for (const s of this.shown().slice().reverse()) {
      const pts = samples
        .filter((p) => typeof p.v[s.key] === 'number')
        .map((p) => [X(p.t), Y(p.v[s.key])]);
      if (!pts.length) continue;
      const d = pts.map(([x, y], i) => `${i ? 'L' : 'M'}${x.toFixed(1)} ${y.toFixed(1)}`).join(' ');
      parts.push(svg('path', { class: 'line', d, stroke: s.color, 'stroke-dasharray': s.dash || null, 'data-series': s.key }));
      const [lx, ly] = pts[pts.length - 1];
      parts.push(svg('circle', { cx: lx, cy: ly, r: 2.5, fill: s.color }));
    }

    const shown = this.hover !== null && samples[this.hover] ? samples[this.hover]
      : samples[samples.length - 1];
    if (this.hover !== null && shown) {
      const x = X(shown.t);
      parts.push(svg('line', { class: 'cursor', x1: x, x2: x, y1: M.top, y2: M.top + ph }));
      const label = svg('text', { x: Math.min(Math.max(x, M.left + 30), W - M.right - 30), y: M.top + 9, 'text-anchor': 'middle' });
      label.textContent = clock(shown.t);
      parts.push(label);
    }
    this.svg.replaceChildren(...parts);
    for (const s of this.series) {
      const v = shown ? shown.v[s.key] : undefined;
      this.values[s.key].textContent = typeof v === 'number' ? this.format(v) : '–';
    }
  }
}
