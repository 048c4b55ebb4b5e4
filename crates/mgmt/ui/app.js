// Warren management UI: a single page over the HTTP API (/api/*, RabbitMQ's URLs and JSON).
// Vanilla JavaScript modules, no build step, nothing loaded from elsewhere.
//
// * Credentials: the login form's name and password become a basic-auth header kept in
//   sessionStorage (this tab only) and sent with every API call; "Log out" forgets it.
// * Routing: the hash (#/queues/%2F/name); each view builds its static part (forms) once and
//   redraws its lists every 5 s, as RabbitMQ's UI does.
// * Charts keep the last hour of samples in memory (the API gives current values and rates
//   only); the time-range choice picks how much of it chart.js draws.
// * Every name, payload or reason from the server reaches the page through textContent or
//   setAttribute (the h() helper below); no markup is ever built from strings.

import { LineChart } from './chart.js';
import { pagedList } from './list.js';
import { exchangeBindings, queueBindings } from './bindings.js';
import { nodesView } from './nodes.js';
import { shovelsView } from './shovels.js';
import {
  $, AUTH_KEY, ApiError, add, api, apiPath, argTags, argumentsEditor, auth, basicAuth, busy,
  clearFlash, clock, deleteButton, exchangeLabel, exchangeSeg, fail, flash, fmtBytes, fmtCount,
  fmtKnown, fmtRate, formGrid, h, hooks, isAdmin, isPolicymaker, kvTable, link, listTable, me,
  options, parseLines, rateOf, renderIfChanged, route, vhostSelect,
} from './core.js';

const POLL_MS = 5000;
const HISTORY_MS = 60 * 60 * 1000;
const RANGE_KEY = 'warren.range';
const USER_KEY = 'warren.user';
const TAGS_KEY = 'warren.tags';

// ---------------------------------------------------------------------------------------------
// Samples kept for the charts (an hour)

const histories = new Map();

function record(key, sample) {
  let list = histories.get(key);
  if (!list) histories.set(key, (list = []));
  const last = list[list.length - 1];
  if (last && sample.t - last.t < 2000) list[list.length - 1] = sample;
  else list.push(sample);
  const cutoff = sample.t - HISTORY_MS;
  while (list.length && list[0].t < cutoff) list.shift();
  // Forget objects not looked at for an hour.
  for (const [k, l] of histories) if (!l.length || l[l.length - 1].t < cutoff) histories.delete(k);
  return list;
}

const RATE_SERIES = [
  { key: 'publish', label: 'Publish', color: '#e6a100', dash: '' },
  { key: 'confirm', label: 'Publisher confirm', color: '#8c4fd6', dash: '7 4' },
  { key: 'deliver_get', label: 'Deliver / get', color: '#2f7fc1', dash: '2 3' },
  { key: 'ack', label: 'Consumer ack', color: '#3f9c3f', dash: '10 3 2 3' },
  { key: 'redeliver', label: 'Redelivered', color: '#c8423b', dash: '4 4' },
];

const QUEUED_SERIES = [
  { key: 'ready', label: 'Ready', color: '#e6a100', dash: '7 4' },
  { key: 'unacked', label: 'Unacked', color: '#2f7fc1', dash: '2 3' },
  { key: 'total', label: 'Total', color: '#c8423b', dash: '' },
];

function rateSample(obj, keys) {
  const v = {};
  for (const k of keys) v[k] = rateOf(obj, k) ?? 0;
  return v;
}

function chartPanel(title, chart) {
  chart.setSpan(currentRange());
  return h('section', { class: 'panel' }, h('h2', null, title), chart.node);
}

/** The charts' time ranges (RabbitMQ's UI offers the same choice); the page keeps an hour. */
const RANGES = [[60 * 1000, 'Last minute'], [10 * 60 * 1000, 'Last ten minutes'], [60 * 60 * 1000, 'Last hour']];

function currentRange() {
  const v = Number(localStorage.getItem(RANGE_KEY));
  return RANGES.some(([ms]) => ms === v) ? v : 10 * 60 * 1000;
}

/** The time-range choice for a page's charts. */
function rangeSelect(...charts) {
  const sel = h('select', { id: 'chart-range', 'aria-label': 'Chart time range' },
    options(RANGES.map(([ms, label]) => [String(ms), label]), String(currentRange())));
  sel.addEventListener('change', () => {
    localStorage.setItem(RANGE_KEY, sel.value);
    for (const c of charts) c.setSpan(Number(sel.value));
  });
  return h('div', { class: 'range' }, h('label', { for: 'chart-range' }, 'Charts: '), sel,
    h('span', { class: 'note' }, ' (kept in this page while it is open, sampled every 5 s)'));
}

/** "Publish message" form (exchange page; on a queue page: the default exchange, to the queue). */
function publishForm(vhost, exchange, queueName) {
  const id = 'publish';
  const rk = h('input', { type: 'text', id: id + '-routing-key' });
  const mode = h('select', { id: id + '-delivery-mode' }, options([['1', '1 - Non-persistent'], ['2', '2 - Persistent']], '1'));
  const headers = h('textarea', { id: id + '-headers', rows: 2, placeholder: 'name=value, one per line' });
  const props = h('textarea', { id: id + '-properties', rows: 2, placeholder: 'content_type=text/plain\nmessage_id=m1' });
  const payload = h('textarea', { id: id + '-payload', rows: 4 });
  const enc = h('select', { id: id + '-encoding' }, options([['string', 'String (default)'], ['base64', 'Base64']], 'string'));
  const rows = [];
  if (queueName === undefined) rows.push(['Routing key', rk]);
  rows.push(['Delivery mode', mode], ['Headers', headers], ['Properties', props,
    'content_type, content_encoding, priority, correlation_id, reply_to, expiration, message_id, timestamp, type, user_id, app_id'],
  ['Payload', payload], ['Payload encoding', enc]);
  const form = formGrid(id, rows, 'Publish message', async () => {
    const properties = parseLines(props.value, ['priority', 'timestamp']);
    properties.delivery_mode = Number(mode.value);
    const hdrs = parseLines(headers.value);
    if (Object.keys(hdrs).length) properties.headers = hdrs;
    const r = await api('POST', apiPath('/exchanges', vhost, exchangeSeg(exchange), 'publish'), {
      properties, routing_key: queueName ?? rk.value, payload: payload.value,
      payload_encoding: enc.value,
    });
    if (r && r.routed) flash('Message published.', 'ok');
    else flash('Message published, but not routed.', 'warn');
  });
  const intro = queueName === undefined ? null
    : h('p', { class: 'note' }, 'Message will be published to the default exchange with routing key ',
      h('code', null, queueName), ', routing it to this queue.');
  return h('details', { class: 'panel', id: 'publish-panel' }, h('summary', null, 'Publish message'), intro, form);
}

// ---------------------------------------------------------------------------------------------
// Global state: the overview, polled every 5 s whatever the page (its charts need the history)

let overview = null;

async function pollOverview() {
  const o = await api('GET', '/overview');
  overview = o;
  const t = Date.now();
  const q = o.queue_totals || {};
  record('overview', {
    t,
    v: rateSample(o, RATE_SERIES.map((s) => s.key)),
    q: { ready: q.messages_ready ?? 0, unacked: q.messages_unacknowledged ?? 0, total: q.messages ?? 0 },
  });
  $('#hdr-node').textContent = o.node || '';
  $('#hdr-cluster').textContent = o.cluster_name || '';
  return o;
}


// ---------------------------------------------------------------------------------------------
// Views: {tab, node, refresh()}

function overviewView() {
  const rates = new LineChart({ id: 'overview-rates', title: 'Message rates', series: RATE_SERIES, format: fmtRate });
  const queued = new LineChart({ id: 'overview-queued', title: 'Queued messages', series: QUEUED_SERIES, format: fmtCount });
  const totals = h('div', { class: 'totals' });
  const node = h('div');
  const churn = h('div');
  const root = h('div', null,
    h('h1', null, 'Overview'),
    h('div', { class: 'row' }, chartPanel('Queued messages', queued), chartPanel('Message rates', rates)),
    rangeSelect(queued, rates),
    h('section', { class: 'panel' }, h('h2', null, 'Global counts'), totals),
    h('div', { class: 'row' },
      h('section', { class: 'panel' }, h('h2', null, 'Node'), node),
      h('section', { class: 'panel' }, h('h2', null, 'Churn statistics'), churn)),
    h('p', { class: 'note' }, 'Export and import definitions under ', link('#/definitions', 'Admin › Definitions'), '.'));

  const refresh = async () => {
    const o = overview || (await pollOverview());
    const hist = histories.get('overview') || [];
    rates.update(hist.map((s) => ({ t: s.t, v: s.v })));
    queued.update(hist.map((s) => ({ t: s.t, v: s.q })));
    const ot = o.object_totals || {};
    renderIfChanged(totals, ot, () => add(document.createDocumentFragment(),
      ['connections', 'channels', 'exchanges', 'queues', 'consumers'].map((k) =>
        h('div', { class: 'total', id: 'total-' + k },
          h('span', { class: 'label' }, k[0].toUpperCase() + k.slice(1)),
          h('span', { class: 'value' }, fmtCount(ot[k] ?? 0))))));
    const info = [o.node, o.cluster_name, o.product_name, o.product_version, o.rabbitmq_version, o.listeners];
    renderIfChanged(node, info, () => h('div', null,
      h('table', { class: 'facts' },
        h('tr', null, h('th', null, 'Node'), h('td', { id: 'node-name', class: 'mono' }, o.node)),
        h('tr', null, h('th', null, 'Cluster'), h('td', null, o.cluster_name)),
        h('tr', null, h('th', null, 'Product'), h('td', null, `${o.product_name || ''} ${o.product_version || ''}`)),
        h('tr', null, h('th', null, 'RabbitMQ compatibility'), h('td', null, o.rabbitmq_version)),
        h('tr', null, h('th', null, 'Management version'), h('td', null, o.management_version))),
      h('h2', { class: 'sub-heading' }, 'Listeners'),
      listTable([
        { title: 'Protocol', cell: (l) => l.protocol },
        { title: 'Bound to', cell: (l) => l.ip_address },
        { title: 'Port', num: true, cell: (l) => l.port },
      ], o.listeners || [])));
    const c = o.churn_rates || {};
    const churnRow = (label, created, closed) => h('tr', null, h('td', null, label),
      h('td', { class: 'num' }, fmtRate(c[created + '_details']?.rate)),
      h('td', { class: 'num' }, fmtRate(c[closed + '_details']?.rate)));
    churn.replaceChildren(h('table', { class: 'list' },
      h('thead', null, h('tr', null, h('th'), h('th', { class: 'num' }, 'Created / declared'), h('th', { class: 'num' }, 'Closed / deleted'))),
      h('tbody', null,
        churnRow('Connections', 'connection_created', 'connection_closed'),
        churnRow('Channels', 'channel_created', 'channel_closed'),
        churnRow('Queues', 'queue_declared', 'queue_deleted'))));
  };
  return { tab: 'overview', node: root, refresh };
}

/** A list page: a table paged, sorted and filtered by the server, redrawn every 5 s, and forms below. */
function listView({ tab, title, path, columns, empty, extra, rowAttrs }) {
  const list = pagedList({ prefix: tab, path, columns, empty, rowAttrs });
  const root = h('div', null, h('h1', null, title, ' ', list.count), list.node,
    extra ? extra(() => list.refresh()) : null);
  return { tab, node: root, refresh: list.refresh };
}

/** A node name without its host part, for narrow columns (the full name as the title). */
function nodeCell(n) {
  if (typeof n !== 'string' || !n) return '';
  return h('span', { class: 'node', title: n }, n);
}

function connectionsView() {
  return listView({
    tab: 'connections', title: 'Connections', path: '/connections', empty: 'No connections.',
    columns: [
      { title: 'Virtual host', sort: 'vhost', cell: (c) => c.vhost },
      { title: 'Name', sort: 'name', cell: (c) => [c.name, c.client_properties?.connection_name ? h('span', { class: 'sub' }, c.client_properties.connection_name) : null] },
      { title: 'Node', sort: 'node', cell: (c) => nodeCell(c.node) },
      { title: 'User', sort: 'user', cell: (c) => c.user },
      { title: 'State', sort: 'state', cell: (c) => c.state },
      { title: 'TLS', cell: (c) => (c.ssl ? '●' : '○') },
      { title: 'Protocol', cell: (c) => c.protocol },
      { title: 'Channels', num: true, sort: 'channels', cell: (c) => fmtCount(c.channels) },
      { title: 'From client', num: true, cell: (c) => (c.recv_oct_details ? fmtBytes(c.recv_oct_details.rate) + '/s' : '') },
      { title: 'To client', num: true, cell: (c) => (c.send_oct_details ? fmtBytes(c.send_oct_details.rate) + '/s' : '') },
      { title: '', cell: (c) => (isAdmin() ? h('button', {
        type: 'button', class: 'danger small', onclick: (e) => {
          if (!confirm(`Force close connection ${c.name}?`)) return;
          busy(e.target, async () => {
            await api('DELETE', apiPath('/connections', c.name));
            flash('Connection closed.');
          });
        },
      }, 'Close') : null) },
    ],
  });
}

function channelsView() {
  return listView({
    tab: 'channels', title: 'Channels', path: '/channels', empty: 'No channels.',
    columns: [
      { title: 'Channel', sort: 'name', cell: (c) => c.name },
      { title: 'Node', sort: 'node', cell: (c) => nodeCell(c.node) },
      { title: 'Virtual host', sort: 'vhost', cell: (c) => c.vhost },
      { title: 'User', sort: 'user', cell: (c) => c.user },
      { title: 'Mode', cell: (c) => [c.confirm ? h('span', { class: 'tag', title: 'Confirm' }, 'C') : null, c.transactional ? h('span', { class: 'tag', title: 'Transactional' }, 'T') : null] },
      { title: 'State', cell: (c) => c.state },
      { title: 'Unconfirmed', num: true, sort: 'messages_unconfirmed', cell: (c) => fmtCount(c.messages_unconfirmed) },
      { title: 'Prefetch', num: true, sort: 'prefetch_count', cell: (c) => fmtCount(c.prefetch_count) },
      { title: 'Unacked', num: true, sort: 'messages_unacknowledged', cell: (c) => fmtCount(c.messages_unacknowledged) },
      { title: 'Publish', num: true, sort: 'message_stats.publish_details.rate', cell: (c) => fmtRate(rateOf(c, 'publish')) },
      { title: 'Confirm', num: true, sort: 'message_stats.confirm_details.rate', cell: (c) => fmtRate(rateOf(c, 'confirm')) },
      { title: 'Deliver / get', num: true, sort: 'message_stats.deliver_get_details.rate', cell: (c) => fmtRate(rateOf(c, 'deliver_get')) },
      { title: 'Ack', num: true, sort: 'message_stats.ack_details.rate', cell: (c) => fmtRate(rateOf(c, 'ack')) },
    ],
  });
}

function exchangesView() {
  return listView({
    tab: 'exchanges', title: 'Exchanges', path: '/exchanges', empty: 'No exchanges.',
    columns: [
      { title: 'Virtual host', sort: 'vhost', cell: (x) => x.vhost },
      { title: 'Name', sort: 'name', cell: (x) => link(route('exchanges', x.vhost, exchangeSeg(x.name)), exchangeLabel(x.name)) },
      { title: 'Type', sort: 'type', cell: (x) => x.type },
      { title: 'Features', cell: (x) => [
        x.durable ? h('span', { class: 'tag feat', title: 'durable' }, 'D') : null,
        x.auto_delete ? h('span', { class: 'tag feat', title: 'auto-delete' }, 'AD') : null,
        x.internal ? h('span', { class: 'tag feat', title: 'internal' }, 'I') : null,
        argTags(x.arguments)] },
      { title: 'Message rate in', num: true, sort: 'message_stats.publish_in_details.rate', cell: (x) => fmtRate(rateOf(x, 'publish_in')) },
      { title: 'Message rate out', num: true, sort: 'message_stats.publish_out_details.rate', cell: (x) => fmtRate(rateOf(x, 'publish_out')) },
    ],
    extra: (reload) => isAdmin() ? addExchangeForm(reload) : null,
  });
}

function addExchangeForm(reload) {
  const vhost = vhostSelect('add-exchange-vhost');
  const name = h('input', { type: 'text', id: 'add-exchange-name', required: true });
  const type = h('select', { id: 'add-exchange-type' },
    options(['direct', 'fanout', 'headers', 'topic', 'x-consistent-hash'].map((t) => [t, t]), 'direct'));
  const durable = h('select', { id: 'add-exchange-durable' }, options([['true', 'Durable'], ['false', 'Transient']], 'true'));
  const autoDelete = h('select', { id: 'add-exchange-auto-delete' }, options([['false', 'No'], ['true', 'Yes']], 'false'));
  const internal = h('select', { id: 'add-exchange-internal' }, options([['false', 'No'], ['true', 'Yes']], 'false'));
  const args = argumentsEditor('add-exchange-args', [['Alternate exchange', 'alternate-exchange', 'string']]);
  const form = formGrid('add-exchange', [
    ['Virtual host', vhost], ['Name', name], ['Type', type], ['Durability', durable],
    ['Auto delete', autoDelete], ['Internal', internal], ['Arguments', args.node],
  ], 'Add exchange', async () => {
    await api('PUT', apiPath('/exchanges', vhost.value, name.value), {
      type: type.value, durable: durable.value === 'true', auto_delete: autoDelete.value === 'true',
      internal: internal.value === 'true', arguments: args.read(),
    });
    flash(`Exchange ${name.value} added.`);
    name.value = '';
    args.clear();
    await reload();
  });
  return h('details', { class: 'panel', open: true }, h('summary', null, 'Add a new exchange'), form);
}

/** A replicated queue's members: a quorum queue's `members` (those not `online` marked down),
 *  or a mirrored classic queue's leader and `slave_nodes`. */
function membersCell(q) {
  const members = Array.isArray(q.members) ? q.members
    : Array.isArray(q.slave_nodes) ? [q.leader || q.node, ...q.slave_nodes].filter(Boolean) : null;
  if (!members) return '';
  const online = Array.isArray(q.online) ? q.online : null;
  return members.map((m) => h('span', {
    class: 'tag member' + (online && !online.includes(m) ? ' offline' : ''),
    title: m + (online && !online.includes(m) ? ' (not online)' : ''),
  }, m));
}

function queuesView() {
  return listView({
    tab: 'queues', title: 'Queues', path: '/queues', empty: 'No queues.',
    rowAttrs: (q) => ({ 'data-queue': q.name, 'data-vhost': q.vhost, 'data-state': q.state }),
    columns: [
      { title: 'Virtual host', sort: 'vhost', cell: (q) => q.vhost },
      { title: 'Name', sort: 'name', cell: (q) => link(route('queues', q.vhost, q.name), q.name) },
      { title: 'Type', sort: 'type', cell: (q) => q.type || 'classic' },
      { title: 'Features', cell: (q) => [
        q.durable ? h('span', { class: 'tag feat', title: 'durable' }, 'D') : null,
        q.auto_delete ? h('span', { class: 'tag feat', title: 'auto-delete' }, 'AD') : null,
        q.exclusive ? h('span', { class: 'tag feat', title: 'exclusive' }, 'Excl') : null,
        argTags(q.arguments),
        q.policy ? h('span', { class: 'tag', title: 'policy' }, q.policy) : null] },
      { title: 'Node', sort: 'node', cell: (q) => nodeCell(q.node) },
      { title: 'Leader', sort: 'leader', cell: (q) => nodeCell(q.leader) },
      { title: 'Members', cell: membersCell },
      { title: 'State', sort: 'state', cell: (q) => h('span', { class: 'state state-' + q.state }, q.state) },
      { title: 'Ready', num: true, sort: 'messages_ready', cell: (q) => h('span', { class: 'count-ready' }, fmtKnown(q.messages_ready)) },
      { title: 'Unacked', num: true, sort: 'messages_unacknowledged', cell: (q) => h('span', { class: 'count-unacked' }, fmtKnown(q.messages_unacknowledged)) },
      { title: 'Total', num: true, sort: 'messages', cell: (q) => h('span', { class: 'count-total' }, fmtKnown(q.messages)) },
      { title: 'Incoming', num: true, sort: 'message_stats.publish_details.rate', cell: (q) => fmtRate(rateOf(q, 'publish')) },
      { title: 'Deliver / get', num: true, sort: 'message_stats.deliver_get_details.rate', cell: (q) => fmtRate(rateOf(q, 'deliver_get')) },
      { title: 'Ack', num: true, sort: 'message_stats.ack_details.rate', cell: (q) => fmtRate(rateOf(q, 'ack')) },
    ],
    extra: (reload) => isAdmin() ? addQueueForm(reload) : null,
  });
}

function addQueueForm(reload) {
  const vhost = vhostSelect('add-queue-vhost');
  const type = h('select', { id: 'add-queue-type' }, options([['classic', 'Classic'], ['quorum', 'Quorum'], ['stream', 'Stream']], 'classic'));
  const name = h('input', { type: 'text', id: 'add-queue-name', required: true });
  const durable = h('select', { id: 'add-queue-durable' }, options([['true', 'Durable'], ['false', 'Transient']], 'true'));
  const autoDelete = h('select', { id: 'add-queue-auto-delete' }, options([['false', 'No'], ['true', 'Yes']], 'false'));
  const args = argumentsEditor('add-queue-args', [
    ['Message TTL', 'x-message-ttl', 'number'], ['Auto expire', 'x-expires', 'number'],
    ['Max length', 'x-max-length', 'number'], ['Max length bytes', 'x-max-length-bytes', 'number'],
    ['Overflow behaviour', 'x-overflow', 'string', 'reject-publish'],
    ['Dead letter exchange', 'x-dead-letter-exchange', 'string'],
    ['Dead letter routing key', 'x-dead-letter-routing-key', 'string'],
    ['Maximum priority', 'x-max-priority', 'number'],
    ['Single active consumer', 'x-single-active-consumer', 'boolean', 'true'],
  ]);
  const form = formGrid('add-queue', [
    ['Virtual host', vhost], ['Type', type], ['Name', name], ['Durability', durable],
    ['Auto delete', autoDelete], ['Arguments', args.node],
  ], 'Add queue', async () => {
    const a = args.read();
    if (type.value !== 'classic') a['x-queue-type'] = type.value;
    await api('PUT', apiPath('/queues', vhost.value, name.value), {
      durable: durable.value === 'true', auto_delete: autoDelete.value === 'true', arguments: a,
    });
    flash(`Queue ${name.value} added.`);
    name.value = '';
    args.clear();
    await reload();
  });
  return h('details', { class: 'panel', open: true }, h('summary', null, 'Add a new queue'), form);
}

function notFound(what) {
  return h('p', { class: 'empty', id: 'not-found' }, what + ' does not exist (any more).');
}

function queueView(vhost, name) {
  const key = 'queue\0' + vhost + '\0' + name;
  const queued = new LineChart({ id: 'queue-queued', title: 'Queued messages', series: QUEUED_SERIES, format: fmtCount });
  const rateSeries = RATE_SERIES.filter((s) => s.key !== 'confirm');
  const rates = new LineChart({ id: 'queue-rates', title: 'Message rates', series: rateSeries, format: fmtRate });
  const details = h('div');
  const consumers = h('div');
  const bindings = queueBindings(vhost, name);
  const body = h('div', null,
    h('div', { class: 'row' }, chartPanel('Queued messages', queued), chartPanel('Message rates', rates)),
    rangeSelect(queued, rates),
    h('section', { class: 'panel' }, h('h2', null, 'Details'), details),
    h('section', { class: 'panel' }, h('h2', null, 'Consumers'), consumers),
    bindings.node,
    isAdmin() ? publishForm(vhost, '', name) : null,
    isAdmin() ? getMessagesPanel(vhost, name) : null,
    isAdmin() ? dangerPanel(vhost, name) : null);
  const root = h('div', null,
    h('h1', null, 'Queue ', h('span', { id: 'queue-name' }, name), h('small', null, 'in virtual host ' + vhost)),
    body);
  let gone = false;

  const refresh = async () => {
    if (gone) return;
    let q;
    try {
      q = await api('GET', apiPath('/queues', vhost, name));
    } catch (e) {
      if (e.status === 404) {
        gone = true;
        body.replaceChildren(notFound(`Queue ${name} in virtual host ${vhost}`));
        return;
      }
      throw e;
    }
    const hist = record(key, {
      t: Date.now(),
      v: rateSample(q, rateSeries.map((s) => s.key)),
      // A count the API leaves out (the queue's node is down) is not plotted.
      q: { ready: q.messages_ready, unacked: q.messages_unacknowledged, total: q.messages },
    });
    rates.update(hist.map((s) => ({ t: s.t, v: s.v })));
    queued.update(hist.map((s) => ({ t: s.t, v: s.q })));
    const shown = { ...q, message_stats: undefined };
    renderIfChanged(details, shown, () => h('div', null,
      h('div', { class: 'totals' }, [['ready', 'Ready', q.messages_ready], ['unacked', 'Unacked', q.messages_unacknowledged],
        ['total', 'Total', q.messages], ['consumers', 'Consumers', q.consumers]].map(([id, label, v]) =>
        h('div', { class: 'total' }, h('span', { class: 'label' }, label),
          h('span', { class: 'value', id: 'queue-' + id }, id === 'consumers' ? fmtCount(v ?? 0) : fmtKnown(v))))),
      h('table', { class: 'facts' },
        h('tr', null, h('th', null, 'Type'), h('td', null, q.type || 'classic')),
        h('tr', null, h('th', null, 'Features'), h('td', null,
          [q.durable ? 'durable' : 'transient', q.auto_delete ? 'auto-delete' : null, q.exclusive ? 'exclusive' : null].filter(Boolean).join(', '))),
        h('tr', null, h('th', null, 'Arguments'), h('td', null, kvTable(q.arguments))),
        h('tr', null, h('th', null, 'Policy'), h('td', null, q.policy || '')),
        h('tr', null, h('th', null, 'Effective policy definition'), h('td', null, kvTable(q.effective_policy_definition))),
        h('tr', null, h('th', null, 'State'), h('td', { id: 'queue-state' }, q.state)),
        h('tr', null, h('th', null, 'Node'), h('td', null, q.node || '')),
        q.leader ? h('tr', null, h('th', null, 'Leader'), h('td', null, q.leader)) : null,
        q.members || q.slave_nodes ? h('tr', null, h('th', null, 'Members'), h('td', null, membersCell(q))) : null)));
    await bindings.refresh();
    const cs = (await api('GET', apiPath('/consumers', vhost))).filter((c) => c.queue && c.queue.name === name);
    renderIfChanged(consumers, cs, () => listTable([
      { title: 'Channel', cell: (c) => c.channel_details?.name ?? '' },
      { title: 'Consumer tag', cell: (c) => c.consumer_tag },
      { title: 'Ack required', cell: (c) => (c.ack_required ? '●' : '○') },
      { title: 'Exclusive', cell: (c) => (c.exclusive ? '●' : '○') },
      { title: 'Prefetch count', num: true, cell: (c) => fmtCount(c.prefetch_count) },
      { title: 'Active', cell: (c) => (c.active ? '●' : '○') },
      { title: 'Activity status', cell: (c) => c.activity_status ?? '' },
      { title: 'Arguments', cell: (c) => kvTable(c.arguments) },
    ], cs, { empty: 'No consumers.' }));
  };
  return { tab: 'queues', node: root, refresh };
}

function getMessagesPanel(vhost, name) {
  const ackmode = h('select', { id: 'get-ackmode' }, options([
    ['ack_requeue_true', 'Nack message requeue true'],
    ['ack_requeue_false', 'Automatic ack'],
    ['reject_requeue_true', 'Reject requeue true'],
    ['reject_requeue_false', 'Reject requeue false'],
  ], 'ack_requeue_true'));
  const encoding = h('select', { id: 'get-encoding' }, options([['auto', 'Auto string / base64'], ['base64', 'base64']], 'auto'));
  const count = h('input', { type: 'number', id: 'get-count', min: 1, value: '1' });
  const results = h('div', { id: 'get-results' });
  const form = formGrid('get', [['Ack mode', ackmode], ['Encoding', encoding], ['Messages', count]], 'Get message(s)', async () => {
    const n = Number(count.value);
    if (!(n >= 1)) throw new ApiError(0, 'Messages: a number of at least 1');
    const msgs = await api('POST', apiPath('/queues', vhost, name, 'get'), {
      count: n, ackmode: ackmode.value, encoding: encoding.value, truncate: 50000,
    });
    if (!msgs.length) {
      results.replaceChildren(h('p', { class: 'empty', id: 'get-empty' }, 'Queue is empty'));
      return;
    }
    results.replaceChildren(...msgs.map((m, i) => h('div', { class: 'message' },
      h('h3', null, `Message ${i + 1}`),
      h('p', { class: 'note' }, `The server reported ${m.message_count} messages remaining.`),
      h('table', { class: 'facts' },
        h('tr', null, h('th', null, 'Exchange'), h('td', null, exchangeLabel(m.exchange))),
        h('tr', null, h('th', null, 'Routing key'), h('td', null, m.routing_key)),
        h('tr', null, h('th', null, 'Redelivered'), h('td', null, m.redelivered ? '●' : '○')),
        h('tr', null, h('th', null, 'Properties'), h('td', null, kvTable(m.properties))),
        h('tr', null, h('th', null, 'Payload'), h('td', null,
          h('span', { class: 'note' }, `${fmtCount(m.payload_bytes)} bytes, encoding: ${m.payload_encoding}`),
          h('pre', { class: 'payload' }, m.payload)))))));
  });
  return h('details', { class: 'panel', id: 'get-panel', open: true }, h('summary', null, 'Get messages'),
    h('p', { class: 'note' }, 'Getting messages from a queue is a destructive action: with "Nack" or "Reject" and requeue they return to the queue, flagged as redelivered.'),
    form, results);
}

function dangerPanel(vhost, name) {
  const del = h('button', { type: 'button', class: 'danger', id: 'delete-queue' }, 'Delete queue');
  const purge = h('button', { type: 'button', class: 'danger', id: 'purge-queue' }, 'Purge messages');
  del.addEventListener('click', () => {
    if (!confirm(`Delete queue ${name}? Its messages are deleted with it.`)) return;
    busy(del, async () => {
      await api('DELETE', apiPath('/queues', vhost, name));
      flash(`Queue ${name} deleted.`);
      location.hash = '#/queues';
    });
  });
  purge.addEventListener('click', () => {
    if (!confirm(`Purge all ready messages from queue ${name}?`)) return;
    busy(purge, async () => {
      await api('DELETE', apiPath('/queues', vhost, name, 'contents'));
      flash('Queue purged.');
      await refreshCurrent();
    });
  });
  return h('section', { class: 'panel' }, h('h2', null, 'Delete or purge'), h('div', { class: 'toolbar' }, del, purge));
}

function exchangeView(vhost, seg) {
  const name = seg === 'amq.default' ? '' : seg;
  const key = 'exchange\0' + vhost + '\0' + name;
  const series = [
    { key: 'publish_in', label: 'Publish (in)', color: '#e6a100' },
    { key: 'publish_out', label: 'Publish (out)', color: '#2f7fc1' },
  ];
  const rates = new LineChart({ id: 'exchange-rates', title: 'Message rates', series, format: fmtRate });
  const details = h('div');
  const bindings = exchangeBindings(vhost, name);
  const del = h('button', { type: 'button', class: 'danger', id: 'delete-exchange' }, 'Delete this exchange');
  del.addEventListener('click', () => {
    if (!confirm(`Delete exchange ${name}?`)) return;
    busy(del, async () => {
      await api('DELETE', apiPath('/exchanges', vhost, seg));
      flash(`Exchange ${name} deleted.`);
      location.hash = '#/exchanges';
    });
  });
  const body = h('div', null,
    h('div', { class: 'row' }, chartPanel('Message rates', rates), h('section', { class: 'panel' }, h('h2', null, 'Details'), details)),
    rangeSelect(rates),
    bindings.node,
    isAdmin() ? publishForm(vhost, name) : null,
    isAdmin() && name !== '' && !name.startsWith('amq.') ? h('section', { class: 'panel' }, h('h2', null, 'Delete'), del) : null);
  const root = h('div', null, h('h1', null, 'Exchange ', h('span', { id: 'exchange-name' }, exchangeLabel(name)), h('small', null, 'in virtual host ' + vhost)), body);
  let gone = false;
  const refresh = async () => {
    if (gone) return;
    let x;
    try {
      x = await api('GET', apiPath('/exchanges', vhost, seg));
    } catch (e) {
      if (e.status === 404) {
        gone = true;
        body.replaceChildren(notFound(`Exchange ${name} in virtual host ${vhost}`));
        return;
      }
      throw e;
    }
    const hist = record(key, { t: Date.now(), v: rateSample(x, series.map((s) => s.key)) });
    rates.update(hist);
    renderIfChanged(details, { ...x, message_stats: undefined }, () => h('table', { class: 'facts' },
      h('tr', null, h('th', null, 'Type'), h('td', null, x.type)),
      h('tr', null, h('th', null, 'Features'), h('td', null,
        [x.durable ? 'durable' : 'transient', x.auto_delete ? 'auto-delete' : null, x.internal ? 'internal' : null].filter(Boolean).join(', '))),
      h('tr', null, h('th', null, 'Arguments'), h('td', null, kvTable(x.arguments)))));
    await bindings.refresh();
  };
  return { tab: 'exchanges', node: root, refresh };
}

// ---- Admin ----

function adminNav(active) {
  const items = isAdmin()
    ? [['users', 'Users'], ['vhosts', 'Virtual hosts'], ['policies', 'Policies'], ['shovels', 'Shovels'], ['definitions', 'Definitions']]
    : [['policies', 'Policies'], ['shovels', 'Shovels']];
  return h('nav', { class: 'subnav' }, items.map(([k, label]) =>
    h('a', { href: '#/' + k, class: k === active ? 'active' : null }, label)));
}


function usersView() {
  const list = h('div');
  const perms = h('div');
  const userSel = h('select', { id: 'perm-user' });
  const reload = async () => {
    const [users, permissions] = await Promise.all([api('GET', '/users'), api('GET', '/permissions')]);
    const access = new Map();
    for (const p of permissions) access.set(p.user, [...(access.get(p.user) || []), p.vhost]);
    renderIfChanged(list, [users, permissions], () => listTable([
      { title: 'Name', cell: (u) => u.name },
      { title: 'Tags', cell: (u) => [u.tags].flat().filter(Boolean).map((t) => h('span', { class: 'tag' }, t)) },
      { title: 'Can access virtual hosts', cell: (u) => (access.get(u.name) || []).join(', ') || h('span', { class: 'note' }, 'No access') },
      { title: 'Has password', cell: (u) => (u.password_hash ? '●' : '○') },
      { title: '', cell: (u) => deleteButton('Delete', `Delete user ${u.name}? Their connections are closed.`, async () => {
        await api('DELETE', apiPath('/users', u.name));
        flash(`User ${u.name} deleted.`);
        await reload();
      }) },
    ], users, { empty: 'No users.', rowAttrs: (u) => ({ 'data-user': u.name }) }));
    renderIfChanged(perms, permissions, () => listTable([
      { title: 'User', cell: (p) => p.user },
      { title: 'Virtual host', cell: (p) => p.vhost },
      { title: 'Configure', cell: (p) => h('code', null, p.configure) },
      { title: 'Write', cell: (p) => h('code', null, p.write) },
      { title: 'Read', cell: (p) => h('code', null, p.read) },
      { title: '', cell: (p) => deleteButton('Clear', `Clear ${p.user}'s permissions on ${p.vhost}?`, async () => {
        await api('DELETE', apiPath('/permissions', p.vhost, p.user));
        flash('Permissions cleared.');
        await reload();
      }) },
    ], permissions, { empty: 'No permissions.' }));
    const cur = userSel.value;
    const names = users.map((u) => u.name);
    if (JSON.stringify(names) !== userSel.dataset.names) {
      userSel.dataset.names = JSON.stringify(names);
      userSel.replaceChildren(...options(names.map((n) => [n, n]), cur));
    }
  };

  const name = h('input', { type: 'text', id: 'add-user-name', required: true, autocomplete: 'off' });
  const pass = h('input', { type: 'password', id: 'add-user-password', autocomplete: 'new-password' });
  const tags = h('input', { type: 'text', id: 'add-user-tags', placeholder: 'comma separated' });
  const tagHelp = h('div', { class: 'helpers' }, 'Set ', [
    ['Admin', 'administrator'], ['Monitoring', 'monitoring'], ['Policymaker', 'policymaker'],
    ['Management', 'management'], ['None', ''],
  ].map(([label, tag]) => h('button', { type: 'button', class: 'plain small', onclick: () => { tags.value = tag; } }, label)));
  const addUser = formGrid('add-user', [
    ['Username', name], ['Password', pass, 'Leave empty for a user who cannot log in with a password.'],
    ['Tags', h('div', null, tags, tagHelp)],
  ], 'Add user', async () => {
    const body = { tags: tags.value.trim() };
    if (pass.value) body.password = pass.value;
    else body.password_hash = '';
    await api('PUT', apiPath('/users', name.value), body);
    flash(`User ${name.value} added.`);
    name.value = pass.value = tags.value = '';
    await reload();
  });

  const vhost = vhostSelect('perm-vhost');
  const conf = h('input', { type: 'text', id: 'perm-configure', value: '.*' });
  const write = h('input', { type: 'text', id: 'perm-write', value: '.*' });
  const read = h('input', { type: 'text', id: 'perm-read', value: '.*' });
  const setPerm = formGrid('set-permission', [
    ['User', userSel], ['Virtual host', vhost], ['Configure regexp', conf], ['Write regexp', write], ['Read regexp', read],
  ], 'Set permission', async () => {
    await api('PUT', apiPath('/permissions', vhost.value, userSel.value), { configure: conf.value, write: write.value, read: read.value });
    flash(`Permissions of ${userSel.value} on ${vhost.value} set.`);
    await reload();
  });

  const root = h('div', null, h('h1', null, 'Admin'), adminNav('users'),
    h('section', { class: 'panel' }, h('h2', null, 'Users'), list),
    h('details', { class: 'panel', open: true }, h('summary', null, 'Add a user'), addUser),
    h('section', { class: 'panel' }, h('h2', null, 'Permissions'), perms),
    h('details', { class: 'panel' }, h('summary', null, 'Set permission'), setPerm));
  return { tab: 'admin', node: root, refresh: reload };
}

function vhostsView() {
  const list = h('div');
  const reload = async () => {
    const vhosts = await api('GET', '/vhosts');
    renderIfChanged(list, vhosts, () => listTable([
      { title: 'Name', cell: (v) => v.name },
      { title: 'Description', cell: (v) => v.description || '' },
      { title: 'Ready', num: true, cell: (v) => fmtCount(v.messages_ready) },
      { title: 'Unacked', num: true, cell: (v) => fmtCount(v.messages_unacknowledged) },
      { title: 'Total', num: true, cell: (v) => fmtCount(v.messages) },
      { title: '', cell: (v) => deleteButton('Delete', `Delete virtual host ${v.name}? Its queues, exchanges, messages, permissions and policies are deleted with it.`, async () => {
        await api('DELETE', apiPath('/vhosts', v.name));
        flash(`Virtual host ${v.name} deleted.`);
        await reload();
      }) },
    ], vhosts, { empty: 'No virtual hosts.', rowAttrs: (v) => ({ 'data-vhost': v.name }) }));
  };
  const name = h('input', { type: 'text', id: 'add-vhost-name', required: true });
  const description = h('input', { type: 'text', id: 'add-vhost-description' });
  const form = formGrid('add-vhost', [['Name', name], ['Description', description]], 'Add virtual host', async () => {
    await api('PUT', apiPath('/vhosts', name.value), { description: description.value });
    flash(`Virtual host ${name.value} added.`);
    name.value = description.value = '';
    await reload();
  });
  const root = h('div', null, h('h1', null, 'Admin'), adminNav('vhosts'),
    h('section', { class: 'panel' }, h('h2', null, 'Virtual hosts'), list),
    h('details', { class: 'panel', open: true }, h('summary', null, 'Add a new virtual host'), form));
  return { tab: 'admin', node: root, refresh: reload };
}

function policiesView() {
  const list = h('div');
  const reload = async () => {
    const policies = await api('GET', '/policies');
    renderIfChanged(list, policies, () => listTable([
      { title: 'Virtual host', cell: (p) => p.vhost },
      { title: 'Name', cell: (p) => p.name },
      { title: 'Pattern', cell: (p) => h('code', null, p.pattern) },
      { title: 'Apply to', cell: (p) => p['apply-to'] },
      { title: 'Definition', cell: (p) => kvTable(p.definition) },
      { title: 'Priority', num: true, cell: (p) => p.priority },
      { title: '', cell: (p) => deleteButton('Delete', `Delete policy ${p.name}?`, async () => {
        await api('DELETE', apiPath('/policies', p.vhost, p.name));
        flash(`Policy ${p.name} deleted.`);
        await reload();
      }) },
    ], policies, { empty: 'No policies.', rowAttrs: (p) => ({ 'data-policy': p.name }) }));
  };
  const vhost = vhostSelect('add-policy-vhost');
  const name = h('input', { type: 'text', id: 'add-policy-name', required: true });
  const pattern = h('input', { type: 'text', id: 'add-policy-pattern', required: true, placeholder: '^amq\\.' });
  const applyTo = h('select', { id: 'add-policy-apply-to' }, options([['all', 'Exchanges and queues'], ['exchanges', 'Exchanges'], ['queues', 'Queues']], 'all'));
  const priority = h('input', { type: 'number', id: 'add-policy-priority', value: '0' });
  const definition = h('textarea', { id: 'add-policy-definition', rows: 3, placeholder: '{"max-length": 1000}' });
  const form = formGrid('add-policy', [
    ['Virtual host', vhost], ['Name', name], ['Pattern', pattern], ['Apply to', applyTo], ['Priority', priority],
    ['Definition', definition, 'A JSON object: message-ttl, expires, max-length, max-length-bytes, overflow, dead-letter-exchange, dead-letter-routing-key, alternate-exchange'],
  ], 'Add / update policy', async () => {
    let def;
    try {
      def = JSON.parse(definition.value || '{}');
    } catch (e) {
      throw new ApiError(0, 'Definition: not JSON (' + e.message + ')');
    }
    if (!def || typeof def !== 'object' || Array.isArray(def)) throw new ApiError(0, 'Definition: a JSON object, e.g. {"max-length": 1000}');
    await api('PUT', apiPath('/policies', vhost.value, name.value), {
      pattern: pattern.value, definition: def, priority: Number(priority.value || 0), 'apply-to': applyTo.value,
    });
    flash(`Policy ${name.value} set.`);
    name.value = pattern.value = definition.value = '';
    await reload();
  });
  const root = h('div', null, h('h1', null, 'Admin'), adminNav('policies'),
    h('section', { class: 'panel' }, h('h2', null, 'Policies'), list),
    h('details', { class: 'panel', open: true }, h('summary', null, 'Add / update a policy'), form));
  return { tab: 'admin', node: root, refresh: reload };
}

function definitionsView() {
  const today = new Date().toISOString().slice(0, 10);
  const nodeName = (overview && overview.node ? overview.node : 'warren').replace(/[^A-Za-z0-9._-]+/g, '_');
  const filename = h('input', { type: 'text', id: 'export-filename', value: `${nodeName}_${today}.json` });
  const exportForm = formGrid('export', [['File name', filename]], 'Download broker definitions', async () => {
    const defs = await api('GET', '/definitions');
    const blob = new Blob([JSON.stringify(defs, null, 2) + '\n'], { type: 'application/json' });
    const url = URL.createObjectURL(blob);
    const a = h('a', { href: url, download: filename.value || 'definitions.json' });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  });
  const file = h('input', { type: 'file', id: 'import-file', accept: '.json,application/json' });
  const importForm = formGrid('import', [['Definitions file', file]], 'Upload broker definitions', async () => {
    const f = file.files && file.files[0];
    if (!f) throw new ApiError(0, 'Choose a definitions file first.');
    const text = await f.text();
    try { JSON.parse(text); } catch (e) { throw new ApiError(0, `${f.name} is not JSON (${e.message})`); }
    await api('POST', '/definitions', text);
    flash('Your definitions were imported successfully.');
    file.value = '';
  });
  const root = h('div', null, h('h1', null, 'Admin'), adminNav('definitions'),
    h('section', { class: 'panel' }, h('h2', null, 'Export definitions'),
      h('p', { class: 'note' }, 'Users (with password hashes), virtual hosts, permissions, policies, durable queues and exchanges, and bindings, as RabbitMQ exports them.'),
      exportForm),
    h('section', { class: 'panel' }, h('h2', null, 'Import definitions'),
      h('p', { class: 'note' }, 'A RabbitMQ or Warren definitions file; what exists is updated, nothing is deleted.'),
      importForm));
  return { tab: 'admin', node: root, refresh: null };
}

function notFoundView() {
  return { tab: null, node: h('div', null, h('h1', null, 'Not found'), h('p', null, 'No such page. ', link('#/', 'Overview'))), refresh: null };
}

function resolve(parts) {
  const [page, a, b] = parts;
  switch (page) {
    case undefined: case '': case 'overview': return overviewView();
    case 'connections': return connectionsView();
    case 'channels': return channelsView();
    case 'exchanges': return a !== undefined && b !== undefined ? exchangeView(a, b) : exchangesView();
    case 'queues': return a !== undefined && b !== undefined ? queueView(a, b) : queuesView();
    case 'nodes': return nodesView();
    case 'users': return isAdmin() ? usersView() : notFoundView();
    case 'vhosts': return isAdmin() ? vhostsView() : notFoundView();
    case 'policies': return isPolicymaker() ? policiesView() : notFoundView();
    case 'shovels': return isPolicymaker() ? shovelsView(adminNav) : notFoundView();
    case 'definitions': return isAdmin() ? definitionsView() : notFoundView();
    default: return notFoundView();
  }
}

// ---------------------------------------------------------------------------------------------
// Shell: login, tabs, polling

let view = null;
let timer = null;
let ticking = false;

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, '');
  if (!raw) return [];
  return raw.split('/').map((s) => {
    try { return decodeURIComponent(s); } catch { return s; }
  });
}

function drawTabs() {
  const tabs = [['overview', '#/', 'Overview'], ['connections', '#/connections', 'Connections'],
    ['channels', '#/channels', 'Channels'], ['exchanges', '#/exchanges', 'Exchanges'], ['queues', '#/queues', 'Queues'], ['nodes', '#/nodes', 'Nodes']];
  if (isPolicymaker()) tabs.push(['admin', isAdmin() ? '#/users' : '#/policies', 'Admin']);
  $('#tabs').replaceChildren(...tabs.map(([k, href, label]) =>
    h('a', { href, 'data-tab': k, class: view && view.tab === k ? 'active' : null }, label)));
}

async function refreshCurrent() {
  const v = view;
  if (!v || !v.refresh) return;
  try {
    await v.refresh();
  } catch (e) {
    if (v === view) fail(e);
  }
}

async function show() {
  if (!auth()) return showLogin();
  view = resolve(parseHash());
  drawTabs();
  $('#main').replaceChildren(view.node);
  await refreshCurrent();
}

async function tick() {
  if (ticking || !auth()) return;
  ticking = true;
  try {
    await pollOverview();
    await refreshCurrent();
    $('#hdr-refreshed').textContent = 'Refreshed ' + clock(Date.now());
  } catch (e) {
    fail(e);
  } finally {
    ticking = false;
  }
}

function start() {
  me.name = sessionStorage.getItem(USER_KEY) || '';
  me.tags = JSON.parse(sessionStorage.getItem(TAGS_KEY) || '[]');
  $('#header').hidden = false;
  $('#hdr-user').textContent = me.name;
  clearInterval(timer);
  timer = setInterval(tick, POLL_MS);
  tick().then(show);
}

function logout(reason) {
  sessionStorage.removeItem(AUTH_KEY);
  sessionStorage.removeItem(USER_KEY);
  sessionStorage.removeItem(TAGS_KEY);
  clearInterval(timer);
  timer = null;
  histories.clear();
  overview = null;
  view = null;
  clearFlash();
  showLogin(reason);
}

function showLogin(reason) {
  $('#header').hidden = true;
  const user = h('input', { type: 'text', id: 'login-username', name: 'username', autocomplete: 'username', required: true });
  const pass = h('input', { type: 'password', id: 'login-password', name: 'password', autocomplete: 'current-password' });
  const error = h('p', { class: 'error', id: 'login-error', role: 'alert', hidden: !reason }, reason || '');
  const button = h('button', { type: 'submit', class: 'primary', id: 'login-submit' }, 'Login');
  const form = h('form', { id: 'login-form' },
    h('label', { for: 'login-username' }, 'Username'), user,
    h('label', { for: 'login-password' }, 'Password'), pass,
    error, button);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    button.disabled = true;
    error.hidden = true;
    try {
      const header = basicAuth(user.value, pass.value);
      const who = await api('GET', '/whoami', undefined, header);
      const tags = Array.isArray(who.tags) ? who.tags : String(who.tags || '').split(',').filter(Boolean);
      sessionStorage.setItem(AUTH_KEY, header);
      sessionStorage.setItem(USER_KEY, who.name);
      sessionStorage.setItem(TAGS_KEY, JSON.stringify(tags));
      start();
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
    } finally {
      button.disabled = false;
    }
  });
  $('#main').replaceChildren(h('div', { class: 'login' },
    h('div', { class: 'brand' }, h('img', { src: '/ui/favicon.svg', alt: '', width: 28, height: 28 }), 'Warren ', h('small', null, 'Management')),
    form));
  user.focus();
}

window.addEventListener('hashchange', () => {
  if (auth()) show();
});
$('#logout').addEventListener('click', () => {
  logout();
  history.replaceState(null, '', '#/');
});

hooks.logout = logout;
if (auth()) start();
else showLogin();
