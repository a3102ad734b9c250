// Lists updated in place: the jobs table, the devices panel and a job's checkpoints table
// are re-read every few seconds and on live events, and each keeps its rows (or items) as
// nodes, keyed by what they show (a job id, a device, a step), rather than drawing them
// anew. A node taken out of the document drops the keyboard's focus to <body>, where a
// keyboard or screen-reader user loses their place (and a screen reader reads the page
// from its top): redrawn at every poll, these lists did that within seconds.

/** Make `parent`'s children the nodes of `nodes`, in that order, in place: a node already
 *  there is neither taken out nor put back where it may stay, and the one that holds the
 *  keyboard's focus is never moved (the others go around it). A child not in `nodes` goes;
 *  if the focus was in it, the focus goes on first, to `focusIn(heir)` of the nearest
 *  node that stays (the next one after it, else the one before it), else to `fallback`;
 *  with neither, it falls to <body> as the node goes. */
export function arrangeInPlace(parent, nodes, { focusIn = () => null, fallback = null } = {}) {
  const wanted = new Set(nodes);
  const gone = [...parent.children].filter((node) => !wanted.has(node));
  const lost = gone.find((node) => node.contains(document.activeElement));
  if (lost) {
    let heir = null;
    for (let node = lost.nextElementSibling; node && !heir; node = node.nextElementSibling) {
      if (wanted.has(node)) heir = node;
    }
    for (let node = lost.previousElementSibling; node && !heir; node = node.previousElementSibling) {
      if (wanted.has(node)) heir = node;
    }
    const target = (heir && focusIn(heir)) || fallback;
    if (target) target.focus({ preventScroll: true });
  }
  for (const node of gone) node.remove();
  const active = document.activeElement;
  const held = nodes.findIndex((node) => node.contains(active));
  const place = (list, cursor) => {
    for (const node of list) {
      if (cursor === node) cursor = cursor.nextElementSibling;
      else parent.insertBefore(node, cursor); // moves one that is elsewhere
    }
  };
  if (held < 0) place(nodes, parent.firstElementChild);
  else {
    place(nodes.slice(0, held), parent.firstElementChild);
    place(nodes.slice(held + 1), nodes[held].nextElementSibling);
  }
}
