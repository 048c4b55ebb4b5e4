// Warren management UI: a list paged, sorted and filtered by the server, with RabbitMQ's API
// parameters (page, page_size, name, use_regex, sort, sort_reverse), so a broker with 100,000
// queues sends one page at a time.
//
// The controls carry ids under the list's prefix (queues-filter, queues-regex, queues-page,
// queues-page-size, queues-next, queues-prev, queues-error); a sortable column's header is a
// button with data-sort (its API key) and, when sorted, data-order "asc" or "desc".

import { api, h, renderIfChanged, ApiError } from './core.js';

export const PAGE_SIZES = [20, 50, 100, 500];

/**
 * @param {{prefix: string, path: string, columns: {title: string, sort?: string, num?: boolean,
 *          cell: (row) => any}[], empty?: string, rowAttrs?: (row) => object}} opts
 * @returns {{node: Element, refresh: () => Promise<void>, count: Element}}
 */
export function pagedList({ prefix, path, columns, empty = 'Nothing to show.', rowAttrs }) {
  const state = { page: 1, pageSize: 100, name: '', regex: false, sort: '', reverse: false };
  const count = h('small', { id: prefix + '-count' });
  const error = h('p', { class: 'error', id: prefix + '-error', role: 'alert', hidden: true });
  const body = h('div', { id: prefix + '-list' });
  const pager = h('div', { class: 'pager', id: prefix + '-pager' });
  let timer = null;
  let last = null;

  const filter = h('input', {
    type: 'text', class: 'filter', id: prefix + '-filter', placeholder: 'Filter by name',
    'aria-label': 'Filter by name',
    oninput: () => {
      clearTimeout(timer);
      timer = setTimeout(() => { state.name = filter.value; state.page = 1; refresh(); }, 300);
    },
  });
  const regex = h('input', {
    type: 'checkbox', id: prefix + '-regex',
    onchange: () => { state.regex = regex.checked; state.page = 1; refresh(); },
  });
  const controls = h('div', { class: 'list-controls' }, filter,
    h('label', { class: 'check', for: prefix + '-regex' }, regex, 'Regex'),
    h('span', { class: 'note' }, ' (case-insensitive)'));

  const url = () => {
    const q = new URLSearchParams({ page: String(state.page), page_size: String(state.pageSize) });
    if (state.name) q.set('name', state.name);
    if (state.regex) q.set('use_regex', 'true');
    if (state.sort) q.set('sort', state.sort);
    if (state.reverse) q.set('sort_reverse', 'true');
    return path + '?' + q.toString();
  };

  const header = (c) => {
    if (!c.sort) return h('th', { class: c.num ? 'num' : null }, c.title);
    const order = state.sort === c.sort ? (state.reverse ? 'desc' : 'asc') : null;
    return h('th', { class: c.num ? 'num' : null, 'aria-sort': order ? (order === 'asc' ? 'ascending' : 'descending') : null },
      h('button', {
        type: 'button', class: 'sort', 'data-sort': c.sort, 'data-order': order,
        title: 'Sort by ' + c.title,
        onclick: () => {
          if (state.sort === c.sort) state.reverse = !state.reverse;
          else { state.sort = c.sort; state.reverse = false; }
          state.page = 1;
          refresh();
        },
      }, c.title, order ? (order === 'asc' ? ' ▲' : ' ▼') : ''));
  };

  const table = (items) => {
    if (!items.length) return h('p', { class: 'empty' }, empty);
    return h('table', { class: 'list' },
      h('thead', null, h('tr', null, columns.map(header))),
      h('tbody', null, items.map((r) => h('tr', rowAttrs ? rowAttrs(r) : null,
        columns.map((c) => h('td', { class: c.num ? 'num' : null }, c.cell(r)))))));
  };

  const drawPager = (reply) => {
    const pages = Math.max(reply.page_count, 1);
    const go = (p) => { state.page = p; refresh(); };
    const pageSel = h('input', {
      type: 'number', id: prefix + '-page', 'aria-label': 'Page', min: 1, max: pages, value: String(reply.page), class: 'page',
      onchange: (e) => {
        const p = Math.trunc(Number(e.target.value));
        go(p >= 1 && p <= pages ? p : reply.page);
      },
    });
    const sizeSel = h('select', {
      id: prefix + '-page-size', 'aria-label': 'Page size',
      onchange: (e) => { state.pageSize = Number(e.target.value); state.page = 1; refresh(); },
    }, PAGE_SIZES.map((n) => h('option', { value: String(n), selected: n === state.pageSize }, String(n))));
    pager.replaceChildren(
      h('button', { type: 'button', class: 'plain small', id: prefix + '-prev', disabled: reply.page <= 1, onclick: () => go(reply.page - 1) }, '‹ Previous'),
      h('span', null, ' Page ', pageSel, ` of ${pages} `),
      h('button', { type: 'button', class: 'plain small', id: prefix + '-next', disabled: reply.page >= pages, onclick: () => go(reply.page + 1) }, 'Next ›'),
      h('span', { class: 'note' }, ' · ', sizeSel, ' per page · ',
        h('span', { id: prefix + '-shown' }, `${reply.item_count} shown, ${reply.filtered_count} match, ${reply.total_count} in all`)));
  };

  async function refresh() {
    let reply;
    try {
      reply = await api('GET', url());
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 400) throw e;
      // page_out_of_range after the list shrank: back to page 1.
      if (/out of range/i.test(e.message) && state.page > 1) {
        state.page = 1;
        return refresh();
      }
      error.textContent = state.regex && state.name
        ? `Invalid filter: "${state.name}" is not a valid regular expression (${e.message}).`
        : e.message;
      error.hidden = false;
      body.dataset.rendered = '';
      body.replaceChildren();
      pager.replaceChildren();
      return;
    }
    error.hidden = true;
    last = reply;
    count.textContent = `(${reply.filtered_count}${reply.filtered_count !== reply.total_count ? ' of ' + reply.total_count : ''})`;
    renderIfChanged(body, [reply.items, state.sort, state.reverse], () => table(reply.items));
    drawPager(reply);
  }

  const node = h('section', { class: 'panel' }, controls, error, body, pager);
  return { node, count, refresh, state: () => ({ ...state, last }) };
}
