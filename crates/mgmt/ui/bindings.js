// Warren management UI: the bindings sections of the exchange and queue pages, with the forms
// that add a binding (POST /api/bindings/{vhost}/e/{source}/{q|e}/{destination}) and the
// buttons that remove one (DELETE …/{properties_key}), as RabbitMQ's pages have them.
//
// Rows carry data-source, data-destination, data-destination-type and data-routing-key; a
// row's remove button has the class "unbind".

import {
  api, apiPath, argumentsEditor, busy, exchangeLabel, exchangeSeg, flash, formGrid, h, isAdmin,
  kvTable, link, listTable, options, renderIfChanged, route,
} from './core.js';

function rowAttrs(b) {
  return {
    'data-source': b.source, 'data-destination': b.destination,
    'data-destination-type': b.destination_type, 'data-routing-key': b.routing_key,
  };
}

function unbindButton(vhost, b, reload) {
  if (!isAdmin() || b.source === '') return null;
  const button = h('button', { type: 'button', class: 'danger small unbind' }, 'Unbind');
  button.addEventListener('click', () => busy(button, async () => {
    const dtype = b.destination_type === 'queue' ? 'q' : 'e';
    await api('DELETE', apiPath('/bindings', vhost, 'e', exchangeSeg(b.source), dtype, b.destination, b.properties_key));
    flash('Binding removed.');
    await reload();
  }));
  return button;
}

function objectLink(vhost, kind, name) {
  if (kind === 'queue') return link(route('queues', vhost, name), name);
  return link(route('exchanges', vhost, exchangeSeg(name)), exchangeLabel(name));
}

function table(vhost, list, side, reload, empty) {
  const columns = [];
  if (side !== 'source') {
    columns.push({ title: 'From', cell: (b) => (b.source === '' ? h('span', { class: 'note' }, '(Default exchange binding)') : objectLink(vhost, 'exchange', b.source)) });
  }
  if (side !== 'queue') {
    columns.push({ title: 'To', cell: (b) => [objectLink(vhost, b.destination_type, b.destination), h('span', { class: 'sub' }, b.destination_type)] });
  }
  columns.push({ title: 'Routing key', cell: (b) => h('code', null, b.routing_key) },
    { title: 'Arguments', cell: (b) => kvTable(b.arguments) },
    { title: '', cell: (b) => unbindButton(vhost, b, reload) });
  return listTable(columns, list, { empty, rowAttrs });
}

/** The add-binding form; `fixed` is the page's own end ({source} or {queue}). */
function addForm(vhost, fixed, reload) {
  const id = 'add-binding';
  const otherKind = h('select', { id: id + '-type' },
    options(fixed.source !== undefined ? [['q', 'To queue'], ['e', 'To exchange']] : [['e', 'From exchange']], fixed.source !== undefined ? 'q' : 'e'));
  const other = h('input', { type: 'text', id: id + '-name', required: true });
  const key = h('input', { type: 'text', id: id + '-routing-key' });
  const args = argumentsEditor(id + '-args', [['x-match (headers)', 'x-match', 'string', 'all']]);
  const form = formGrid(id, [[otherKind, other], ['Routing key', key], ['Arguments', args.node]], 'Bind', async () => {
    const body = { routing_key: key.value, arguments: args.read() };
    if (fixed.source !== undefined) {
      await api('POST', apiPath('/bindings', vhost, 'e', exchangeSeg(fixed.source), otherKind.value, other.value), body);
    } else {
      await api('POST', apiPath('/bindings', vhost, 'e', exchangeSeg(other.value), 'q', fixed.queue), body);
    }
    flash('Binding added.');
    other.value = key.value = '';
    args.clear();
    await reload();
  });
  const title = fixed.source !== undefined ? 'Add binding from this exchange' : 'Add binding to this queue';
  return h('details', { class: 'panel', id: id + '-panel', open: true }, h('summary', null, title), form);
}

/** The exchange page's bindings: from it (to queues and exchanges) and to it, and the form. */
export function exchangeBindings(vhost, name) {
  const from = h('div', { id: 'bindings-source' });
  const to = h('div', { id: 'bindings-destination' });
  const seg = exchangeSeg(name);
  const refresh = async () => {
    const [src, dst] = await Promise.all([
      api('GET', apiPath('/exchanges', vhost, seg, 'bindings', 'source')),
      name === '' ? [] : api('GET', apiPath('/exchanges', vhost, seg, 'bindings', 'destination')),
    ]);
    renderIfChanged(from, src, () => table(vhost, src, 'source', refresh, 'No bindings.'));
    renderIfChanged(to, dst, () => table(vhost, dst, 'destination', refresh, 'No bindings.'));
  };
  const node = h('div', null,
    h('section', { class: 'panel' }, h('h2', null, 'Bindings from this exchange'), from),
    name === '' ? null : h('section', { class: 'panel' }, h('h2', null, 'Bindings to this exchange'), to),
    isAdmin() && name !== '' ? addForm(vhost, { source: name }, refresh) : null);
  return { node, refresh };
}

/** The queue page's bindings (the default exchange's first) and the form. */
export function queueBindings(vhost, name) {
  const list = h('div', { id: 'bindings-queue' });
  const refresh = async () => {
    const bs = await api('GET', apiPath('/queues', vhost, name, 'bindings'));
    renderIfChanged(list, bs, () => table(vhost, bs, 'queue', refresh, 'No bindings.'));
  };
  const node = h('div', null,
    h('section', { class: 'panel' }, h('h2', null, 'Bindings'), list),
    isAdmin() ? addForm(vhost, { queue: name }, refresh) : null);
  return { node, refresh };
}
