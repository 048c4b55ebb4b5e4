// Warren management UI: the Nodes page (#/nodes), from GET /api/nodes (every cluster member; a
// member that does not answer is listed with "running": false and nothing else) and, in a
// cluster, GET /api/warren/cluster for each member's role in the metadata Raft group.
//
// Each row carries data-node (the name) and data-running ("true"/"false"); the state cell has
// the class node-state.

import { api, fmtBytes, fmtCount, h, renderIfChanged } from './core.js';

function uptime(ms) {
  if (typeof ms !== 'number') return '';
  const s = Math.floor(ms / 1000);
  const d = Math.floor(s / 86400);
  const hh = Math.floor((s % 86400) / 3600);
  const mm = Math.floor((s % 3600) / 60);
  if (d) return `${d}d ${hh}h`;
  if (hh) return `${hh}h ${mm}m`;
  return `${mm}m ${s % 60}s`;
}

/** "used / limit" with a bar, or "" when the node did not report it. */
function gauge(used, limit, fmt, { low = false } = {}) {
  if (typeof used !== 'number') return '';
  const text = typeof limit === 'number' && limit > 0 ? `${fmt(used)} / ${fmt(limit)}` : fmt(used);
  // For disk the limit is a floor (alarm below it); for memory and descriptors a ceiling.
  const bad = typeof limit === 'number' && limit > 0 && (low ? used < limit : used >= limit);
  const frac = typeof limit === 'number' && limit > 0 ? Math.min(1, low ? limit / Math.max(used, 1) : used / limit) : 0;
  const fill = h('span', { class: 'fill' });
  fill.style.width = (frac * 100).toFixed(0) + '%';
  return h('div', { class: 'gauge' + (bad ? ' alarm' : '') },
    h('span', { class: 'gauge-text' }, text), h('span', { class: 'bar' }, fill));
}

export function nodesView() {
  const list = h('div', { id: 'nodes-list' });
  const count = h('small');
  const refresh = async () => {
    const [nodes, cluster] = await Promise.all([
      api('GET', '/nodes'),
      api('GET', '/warren/cluster').catch(() => null),
    ]);
    const leader = cluster && cluster.leader;
    count.textContent = `(${nodes.filter((n) => n.running).length} of ${nodes.length} running)`;
    renderIfChanged(list, [nodes.map((n) => ({ ...n, uptime: Math.floor((n.uptime || 0) / 60000) })), leader], () => h('table', { class: 'list' },
      h('thead', null, h('tr', null, ['Name', 'State', 'Raft role', 'Uptime', 'Memory', 'Disk free', 'File descriptors', 'Connections', 'Alarms']
        .map((t) => h('th', null, t)))),
      h('tbody', null, nodes.map((n) => {
        const alarms = [n.mem_alarm ? 'memory' : null, n.disk_free_alarm ? 'disk' : null].filter(Boolean);
        return h('tr', { 'data-node': n.name, 'data-running': String(Boolean(n.running)) },
          h('td', { class: 'mono' }, n.name),
          h('td', null, h('span', { class: 'node-state ' + (n.running ? 'running' : 'down') }, n.running ? 'running' : 'down')),
          h('td', null, cluster ? (!n.running ? '' : n.name === leader ? 'leader' : 'follower') : ''),
          h('td', null, n.running ? uptime(n.uptime) : ''),
          h('td', null, gauge(n.mem_used, n.mem_limit, fmtBytes)),
          h('td', null, gauge(n.disk_free, n.disk_free_limit, fmtBytes, { low: true })),
          h('td', null, gauge(n.fd_used, n.fd_total, fmtCount)),
          h('td', { class: 'num' }, fmtCount(n.sockets_used)),
          h('td', null, !n.running ? '' : alarms.length
            ? alarms.map((a) => h('span', { class: 'tag alarm' }, a))
            : h('span', { class: 'note' }, 'none')));
      }))));
  };
  const root = h('div', null, h('h1', null, 'Nodes ', count),
    h('section', { class: 'panel' }, list),
    h('p', { class: 'note' }, 'A node that does not answer is shown down; its figures are unknown until it is back.'));
  return { tab: 'nodes', node: root, refresh };
}
