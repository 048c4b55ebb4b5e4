// Warren management UI: the pieces every page uses. DOM building (h: names and payloads go in
// as text, never as markup), number formats, the API client (basic auth from sessionStorage),
// the message line at the top, and shared tables and forms.

/** Set by app.js: what to do when the login no longer holds. */
export const hooks = { logout: () => {} };

/** The logged-in user (app.js fills it in). */
export const me = { name: '', tags: [] };
export const isAdmin = () => me.tags.includes('administrator');
export const isPolicymaker = () => isAdmin() || me.tags.includes('policymaker');

export const AUTH_KEY = 'warren.auth';
/** Rows drawn at most by a list that is not paged by the server. */
const MAX_ROWS = 500;

// ---------------------------------------------------------------------------------------------
// DOM helpers

/** Builds an element. attrs: on* are listeners, class, value, checked, selected, disabled are
 *  properties, anything else an attribute; children: nodes or text (arrays are flattened). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  let value;
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'value') value = v;
    else if (k === 'checked' || k === 'selected' || k === 'disabled') el[k] = Boolean(v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  add(el, children);
  if (value !== undefined) el.value = value;
  return el;
}

export function add(el, children) {
  for (const c of [children].flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

export const $ = (sel) => document.querySelector(sel);

export function options(list, selected) {
  return list.map(([value, label]) => h('option', { value, selected: value === selected }, label));
}

// ---------------------------------------------------------------------------------------------
// Formatting

export function fmtCount(v) {
  return typeof v === 'number' ? v.toLocaleString('en-US') : '';
}

/** A count the API may leave out (a queue whose node is down): "unknown", never 0 or blank. */
export function fmtKnown(v) {
  return typeof v === 'number' ? fmtCount(v) : h('span', { class: 'unknown' }, 'unknown');
}

export function fmtRate(v) {
  if (typeof v !== 'number') return '';
  return (v >= 100 ? Math.round(v).toLocaleString('en-US') : v.toFixed(1)) + '/s';
}

export function fmtBytes(v) {
  if (typeof v !== 'number') return '';
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (v >= 1000 && i < units.length - 1) { v /= 1000; i++; }
  return (i ? v.toFixed(1) : String(Math.round(v))) + ' ' + units[i];
}

export function clock(t) {
  return new Date(t).toTimeString().slice(0, 8);
}

export function rateOf(obj, key) {
  const d = obj && obj.message_stats && obj.message_stats[key + '_details'];
  return d && typeof d.rate === 'number' ? d.rate : undefined;
}

export function jsonText(v) {
  return typeof v === 'string' ? v : JSON.stringify(v);
}

export function exchangeLabel(name) {
  return name === '' ? '(AMQP default)' : name;
}

/** An exchange's name as it goes into a URL: RabbitMQ calls the default one amq.default. */
export function exchangeSeg(name) {
  return name === '' ? 'amq.default' : name;
}

export function link(hash, text) {
  return h('a', { href: hash }, text);
}

export function route(...segs) {
  return '#/' + segs.map(encodeURIComponent).join('/');
}

// ---------------------------------------------------------------------------------------------
// API

export class ApiError extends Error {
  constructor(status, reason) {
    super(reason);
    this.status = status;
  }
}

export function basicAuth(user, pass) {
  let bin = '';
  for (const b of new TextEncoder().encode(user + ':' + pass)) bin += String.fromCharCode(b);
  return 'Basic ' + btoa(bin);
}

export const auth = () => sessionStorage.getItem(AUTH_KEY);

/** /api + the segments, each percent-encoded. */
export function apiPath(...segs) {
  return segs.map((s, i) => (i === 0 ? s : encodeURIComponent(s))).join('/');
}

/**
 * Calls the API. credentials: 'omit' keeps the browser from answering the 401's
 * WWW-Authenticate with a password prompt of its own (and from adding a cached login).
 */
export async function api(method, path, body, authHeader = auth()) {
  const init = { method, headers: { Authorization: authHeader || '' }, credentials: 'omit', cache: 'no-store' };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = typeof body === 'string' ? body : JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch('/api' + path, init);
  } catch (e) {
    throw new ApiError(0, 'Could not reach the server (' + e.message + ')');
  }
  const text = await res.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = text; }
  }
  if (!res.ok) {
    let reason = data && typeof data === 'object' ? (data.reason ?? data.error) : data;
    if (!reason) reason = `${res.status} ${res.statusText}`;
    throw new ApiError(res.status, jsonText(reason));
  }
  return data;
}

/** A 401 whose reason says the login itself no longer holds (not a missing tag for a write). */
export function loginLost(e) {
  return e instanceof ApiError && e.status === 401 && !/administrator/i.test(e.message);
}

// ---------------------------------------------------------------------------------------------
// Messages at the top of the page

let flashTimer = null;

export function flash(text, kind = 'ok') {
  const el = $('#flash');
  clearTimeout(flashTimer);
  el.className = kind;
  el.dataset.kind = kind;
  el.replaceChildren(h('span', { id: 'flash-text' }, text),
    h('button', { type: 'button', title: 'Dismiss', onclick: clearFlash }, '×'));
  el.hidden = false;
  if (kind !== 'error') flashTimer = setTimeout(clearFlash, 15000);
}

export function clearFlash() {
  const el = $('#flash');
  el.hidden = true;
  el.replaceChildren();
}

export function fail(e) {
  if (loginLost(e)) return hooks.logout(e.message);
  flash(e.message, 'error');
}

/** Runs an action with its button disabled; errors go to the flash. */
export async function busy(button, fn) {
  if (button) button.disabled = true;
  try {
    return await fn();
  } catch (e) {
    fail(e);
    return undefined;
  } finally {
    if (button) button.disabled = false;
  }
}


// ---------------------------------------------------------------------------------------------
// Shared pieces of views

/** A table; columns: {title, num?, cell(row) -> node|text}. */
export function listTable(columns, rows, { empty = 'Nothing to show.', rowAttrs } = {}) {
  if (!rows.length) return h('p', { class: 'empty' }, empty);
  const shown = rows.slice(0, MAX_ROWS);
  const table = h('table', { class: 'list' },
    h('thead', null, h('tr', null, columns.map((c) => h('th', { class: c.num ? 'num' : null }, c.title)))),
    h('tbody', null, shown.map((r) => h('tr', rowAttrs ? rowAttrs(r) : null,
      columns.map((c) => h('td', { class: c.num ? 'num' : null }, c.cell(r)))))));
  if (rows.length <= MAX_ROWS) return table;
  return h('div', null, table,
    h('p', { class: 'note' }, `Showing the first ${MAX_ROWS} of ${rows.length}; use the filter to narrow the list.`));
}

/** Redraws `container` from `data` only when the data changed (keeps buttons under the mouse). */
export function renderIfChanged(container, data, build) {
  const key = JSON.stringify(data);
  if (container.dataset.rendered === key) return;
  container.dataset.rendered = key;
  container.replaceChildren(build());
}

export function filterInput(onChange, placeholder = 'Filter by name') {
  return h('input', { type: 'text', class: 'filter', placeholder, 'aria-label': placeholder,
    oninput: (e) => onChange(e.target.value.trim().toLowerCase()) });
}

export function matches(filter, ...texts) {
  return !filter || texts.some((t) => String(t).toLowerCase().includes(filter));
}

/** Form rows: [label, control, hint?] -> a grid form. */
export function formGrid(id, rows, submitLabel, onSubmit) {
  const button = h('button', { type: 'submit', class: 'primary', id: id + '-submit' }, submitLabel);
  const form = h('form', { class: 'form', id, autocomplete: 'off' },
    rows.map(([label, control, hint]) => [
      h('label', { for: control.id || null }, label), control,
      hint ? h('div', { class: 'hint note' }, hint) : null,
    ]),
    h('div', { class: 'actions' }, button));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    busy(button, () => onSubmit(form));
  });
  return form;
}

/** A <select> of the vhosts, filled once from the API. */
export function vhostSelect(id) {
  const sel = h('select', { id }, h('option', { value: '/' }, '/'));
  api('GET', '/vhosts').then((vs) => {
    const current = sel.value;
    sel.replaceChildren(...options(vs.map((v) => [v.name, v.name]), current));
    if (![...sel.options].some((o) => o.value === current) && sel.options.length) sel.selectedIndex = 0;
  }).catch(() => {});
  return sel;
}

/** Rows of name / value / type for queue and exchange arguments, with RabbitMQ's shortcuts. */
export function argumentsEditor(id, shortcuts) {
  const rows = h('div', { class: 'args', id });
  const addRow = (name = '', value = '', type = 'string') => {
    const nameEl = h('input', { type: 'text', placeholder: 'name', value: name, class: 'arg-name' });
    const valueEl = h('input', { type: 'text', placeholder: 'value', value, class: 'arg-value' });
    const typeEl = h('select', { class: 'arg-type' },
      options([['string', 'String'], ['number', 'Number'], ['boolean', 'Boolean']], type));
    const remove = h('button', { type: 'button', class: 'plain small', title: 'Remove' }, '×');
    remove.addEventListener('click', () => { nameEl.remove(); valueEl.remove(); typeEl.remove(); remove.remove(); });
    rows.append(nameEl, valueEl, typeEl, remove);
    return valueEl;
  };
  const helpers = h('div', { class: 'helpers' }, 'Add ',
    h('button', { type: 'button', class: 'plain small', onclick: () => addRow() }, 'argument'),
    shortcuts.map(([label, name, type, value]) => h('button', {
      type: 'button', class: 'plain small', title: name,
      onclick: () => addRow(name, value ?? '', type).focus(),
    }, label)));
  const read = () => {
    const args = {};
    const names = rows.querySelectorAll('.arg-name');
    const values = rows.querySelectorAll('.arg-value');
    const types = rows.querySelectorAll('.arg-type');
    names.forEach((n, i) => {
      const name = n.value.trim();
      if (!name) return;
      const raw = values[i].value.trim();
      if (types[i].value === 'number') {
        const num = Number(raw);
        if (raw === '' || Number.isNaN(num)) throw new ApiError(0, `Argument ${name}: "${raw}" is not a number`);
        args[name] = num;
      } else if (types[i].value === 'boolean') {
        args[name] = raw === 'true' || raw === '1' || raw === 'yes';
      } else {
        args[name] = raw;
      }
    });
    return args;
  };
  const clear = () => rows.replaceChildren();
  return { node: h('div', null, rows, helpers), read, clear };
}

/** name=value lines (headers, properties) -> an object; integer-looking values of `ints` become numbers. */
export function parseLines(text, ints = []) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    const i = line.indexOf('=');
    if (i < 1) throw new ApiError(0, `"${line.trim()}" is not name=value`);
    const k = line.slice(0, i).trim();
    const v = line.slice(i + 1).trim();
    out[k] = ints.includes(k) && /^-?\d+$/.test(v) ? Number(v) : v;
  }
  return out;
}

export function kvTable(obj) {
  const entries = Object.entries(obj || {});
  if (!entries.length) return h('span', { class: 'note' }, 'none');
  return h('table', { class: 'facts' }, entries.map(([k, v]) =>
    h('tr', null, h('th', null, k), h('td', { class: 'mono' }, jsonText(v)))));
}

export function argTags(args) {
  return Object.entries(args || {}).map(([k, v]) => h('span', { class: 'tag', title: k + ': ' + jsonText(v) }, k));
}


export function deleteButton(label, question, action) {
  const b = h('button', { type: 'button', class: 'danger small' }, label);
  b.addEventListener('click', () => {
    if (!confirm(question)) return;
    busy(b, action);
  });
  return b;
}
