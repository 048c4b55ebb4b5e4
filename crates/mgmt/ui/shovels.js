// Warren management UI: the Shovels page (#/shovels), as RabbitMQ's shovel management plugin
// shows them: every shovel of the cluster from GET /api/shovels (state, the node that runs it,
// its ends, counts, the reason it terminated), restart (DELETE /api/shovels/vhost/V/N/restart)
// and delete (DELETE /api/parameters/shovel/V/N), and a form that sets one
// (PUT /api/parameters/shovel/V/N) with RabbitMQ's keys.
//
// Each row carries data-shovel (the name) and data-state; the state cell has the class
// shovel-state.

import {
  api, apiPath, busy, deleteButton, flash, fmtCount, formGrid, h, listTable, options, renderIfChanged,
  vhostSelect,
} from './core.js';

/** "queue q" / "exchange x (key k)" for one end of a row. */
function end(row, side) {
  const q = row[`${side}_queue`];
  if (q !== undefined) return `queue ${q}`;
  const x = row[`${side}_exchange`];
  if (x === undefined) return '';
  const k = row[`${side}_exchange_key`];
  return k !== undefined ? `exchange ${x || '(default)'} (key ${k})` : `exchange ${x || '(default)'}`;
}

function restartButton(s, reload) {
  const b = h('button', { type: 'button', class: 'restart small' }, 'Restart');
  b.addEventListener('click', () => busy(b, async () => {
    await api('DELETE', apiPath('/shovels/vhost', s.vhost, s.name) + '/restart');
    flash(`Shovel ${s.name} restarted.`);
    await reload();
  }));
  return b;
}

export function shovelsView(adminNav) {
  const list = h('div', { id: 'shovels-list' });
  const reload = async () => {
    const rows = await api('GET', '/shovels');
    renderIfChanged(list, rows, () => listTable([
      { title: 'Virtual host', cell: (s) => s.vhost },
      { title: 'Name', cell: (s) => s.name },
      { title: 'State', cell: (s) => h('span', { class: 'shovel-state ' + s.state }, s.state) },
      { title: 'Node', cell: (s) => h('span', { class: 'mono' }, s.node) },
      { title: 'Source', cell: (s) => [h('div', { class: 'mono' }, s.src_uri || ''), h('div', null, end(s, 'src'))] },
      { title: 'Destination', cell: (s) => [h('div', { class: 'mono' }, s.dest_uri || ''), h('div', null, end(s, 'dest'))] },
      { title: 'Forwarded', num: true, cell: (s) => fmtCount(s.forwarded) },
      { title: 'Pending', num: true, cell: (s) => fmtCount(s.pending) },
      { title: 'Remaining', num: true, cell: (s) => (s.remaining === undefined ? '' : fmtCount(s.remaining)) },
      { title: 'Since', cell: (s) => s.timestamp },
      { title: 'Reason', cell: (s) => (s.reason ? h('span', { class: 'note' }, s.reason) : '') },
      { title: '', cell: (s) => [
        restartButton(s, reload),
        deleteButton('Delete', `Delete shovel ${s.name}? Messages it holds go back to the source.`, async () => {
          await api('DELETE', apiPath('/parameters/shovel', s.vhost, s.name));
          flash(`Shovel ${s.name} deleted.`);
          await reload();
        }),
      ] },
    ], rows, { empty: 'No shovels.', rowAttrs: (s) => ({ 'data-shovel': s.name, 'data-state': s.state }) }));
  };
  const vhost = vhostSelect('add-shovel-vhost');
  const name = h('input', { type: 'text', id: 'add-shovel-name', required: true });
  const srcUri = h('input', { type: 'text', id: 'add-shovel-src-uri', value: 'amqp://', required: true });
  const srcKind = h('select', { id: 'add-shovel-src-kind' }, options([['queue', 'Queue'], ['exchange', 'Exchange']], 'queue'));
  const src = h('input', { type: 'text', id: 'add-shovel-src', required: true });
  const srcKey = h('input', { type: 'text', id: 'add-shovel-src-key', placeholder: 'routing key (exchange only)' });
  const destUri = h('input', { type: 'text', id: 'add-shovel-dest-uri', value: 'amqp://', required: true });
  const destKind = h('select', { id: 'add-shovel-dest-kind' }, options([['queue', 'Queue'], ['exchange', 'Exchange']], 'queue'));
  const dest = h('input', { type: 'text', id: 'add-shovel-dest', required: true });
  const destKey = h('input', { type: 'text', id: 'add-shovel-dest-key', placeholder: "routing key (exchange only; empty: the message's)" });
  const ackMode = h('select', { id: 'add-shovel-ack-mode' }, options([['on-confirm', 'On confirm'], ['on-publish', 'On publish'], ['no-ack', 'No ack']], 'on-confirm'));
  const prefetch = h('input', { type: 'number', id: 'add-shovel-prefetch', value: '1000' });
  const deleteAfter = h('select', { id: 'add-shovel-delete-after' }, options([['never', 'Never'], ['queue-length', 'After initial length transferred']], 'never'));
  const form = formGrid('add-shovel', [
    ['Virtual host', vhost], ['Name', name],
    ['Source URI', srcUri, 'amqp:// is this broker; amqp://user:pass@host:port/vhost another one'],
    ['Source', h('span', null, srcKind, src, srcKey)],
    ['Destination URI', destUri], ['Destination', h('span', null, destKind, dest, destKey)],
    ['Acknowledgement mode', ackMode], ['Prefetch count', prefetch], ['Auto-delete', deleteAfter],
  ], 'Add shovel', async () => {
    const value = {
      'src-uri': srcUri.value, 'dest-uri': destUri.value, 'ack-mode': ackMode.value,
      'src-prefetch-count': Number(prefetch.value || 1000), 'src-delete-after': deleteAfter.value,
    };
    if (srcKind.value === 'queue') value['src-queue'] = src.value;
    else { value['src-exchange'] = src.value; value['src-exchange-key'] = srcKey.value; }
    if (destKind.value === 'queue') value['dest-queue'] = dest.value;
    else {
      value['dest-exchange'] = dest.value;
      if (destKey.value) value['dest-exchange-key'] = destKey.value;
    }
    await api('PUT', apiPath('/parameters/shovel', vhost.value, name.value), { value });
    flash(`Shovel ${name.value} added.`);
    name.value = src.value = dest.value = srcKey.value = destKey.value = '';
    await reload();
  });
  const root = h('div', null, h('h1', null, 'Admin'), adminNav('shovels'),
    h('section', { class: 'panel' }, h('h2', null, 'Shovels'), list),
    h('details', { class: 'panel', open: true }, h('summary', null, 'Add a shovel'), form));
  return { tab: 'admin', node: root, refresh: reload };
}
