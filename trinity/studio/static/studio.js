// The studio page: renders the form the server reads from the config schema (/api/form),
// keeps only the values the user set, and asks the server to check them as they change.
"use strict";
const EXTRA = "__extra__";
let defs = {};
let supported = {};  // key pattern -> JSON of the values that run (the checks' own table)
let rootModel = "";
let values = {};
let checkSeq = 0;
let checkTimer = null;

const $ = (id) => document.getElementById(id);
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  Object.entries(attrs || {}).forEach(([k, v]) => {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  });
  children.forEach((c) => node.append(c));
  return node;
}
const pathName = (path) => path.join(".");
// The key as the supported table names it: list indices as *, a stage's keys as the top's.
const keyPattern = (path) => path.map((p) => (typeof p === "number" ? "*" : p)).join(".")
  .replace(/^stages\.\*\./, "");
// The path as problems name it: list indices as [i].
const problemPath = (path) => path.reduce(
  (s, p) => (typeof p === "number" ? `${s}[${p}]` : s ? `${s}.${p}` : p), "");

function getAt(path) {
  return path.reduce((node, key) => (node == null ? undefined : node[key]), values);
}
function setAt(path, value) {
  let node = values;
  path.slice(0, -1).forEach((key, i) => {
    if (node[key] == null) node[key] = typeof path[i + 1] === "number" ? [] : {};
    node = node[key];
  });
  const last = path[path.length - 1];
  if (value === undefined) delete node[last]; else node[last] = value;
}

async function api(url, body) {
  const response = await fetch(url, body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
  });
  return response.json();
}

function changed(path, value) {
  setAt(path, value === "" ? undefined : value);
  const field = document.querySelector(`[data-field="${CSS.escape(pathName(path))}"]`);
  if (field) field.classList.toggle("set", value !== "" && value !== undefined);
  scheduleCheck();
}

function leafInput(spec, path) {
  const name = pathName(path);
  const current = getAt(path);
  let input;
  if (spec.kind === "bool" || spec.kind === "choice") {
    const choices = spec.kind === "bool" ? ["true", "false"] : spec.choices;
    input = el("select", {name});
    input.append(el("option", {value: ""}, `(default: ${spec.default})`));
    const runs = supported[keyPattern(path)];
    choices.forEach((c) => {
      const label = c.replace(/^"(.*)"$/, "$1");
      const option = runs && !runs.includes(c)
        ? el("option", {value: c, disabled: ""}, `${label} (not supported yet)`)
        : el("option", {value: c}, label);
      input.append(option);
    });
    input.value = current === undefined ? "" : String(current);
    input.addEventListener("change", () => {
      const v = input.value;
      changed(path, spec.kind === "bool" && v !== "" ? v === "true" : v);
    });
    return input;
  }
  input = spec.kind === "yaml" ? el("textarea", {name, rows: "1"}) : el("input", {name, type: "text"});
  input.placeholder = spec.default === undefined ? "" : spec.default;
  input.value = current === undefined ? "" : current;
  input.addEventListener("input", () => changed(path, input.value));
  // A free-text key whose runnable values come from a registry (storage_type, monitor_type):
  // they are offered as suggestions, a plugin's name can still be typed.
  const runs = supported[keyPattern(path)];
  if (spec.kind !== "yaml" && runs) {
    const list = el("datalist", {id: `runs-${name}`});
    runs.filter((c) => c !== "null").forEach((c) => {
      list.append(el("option", {value: c.replace(/^"(.*)"$/, "$1")}));
    });
    input.setAttribute("list", list.id);
    return el("span", {class: "suggested"}, input, list);
  }
  return input;
}

function fieldRow(spec, path) {
  const doc = el("small", {}, spec.doc);
  if (spec.inert) doc.append(el("span", {class: "inert"}, ` (no effect here: ${spec.inert})`));
  const row = el("div", {class: "field", "data-field": pathName(path),
                         "data-problem-path": problemPath(path)},
                 el("label", {}, spec.key), leafInput(spec, path), doc);
  row.classList.toggle("set", getAt(path) !== undefined);
  return row;
}

function hasValues(node) {
  return node !== undefined && node !== null && Object.keys(node).length > 0;
}

function sectionBlock(spec, path) {
  const summary = el("summary", {}, spec.key, el("small", {}, ` — ${spec.doc}`));
  const block = el("details", {"data-section": pathName(path)}, summary);
  const body = el("div");
  block.append(body);
  let rendered = false;
  block.addEventListener("toggle", () => {
    if (block.open && !rendered) { rendered = true; renderModel(body, spec.model, path); }
  });
  if (hasValues(getAt(path))) block.open = true;
  return block;
}

function listBlock(spec, path) {
  const block = el("details", {"data-section": pathName(path)},
                   el("summary", {}, spec.key, el("small", {}, ` — ${spec.doc}`)));
  const items = el("div");
  const add = el("button", {type: "button", "data-add": pathName(path)}, `+ add to ${spec.key}`);
  const draw = () => {
    items.replaceChildren();
    (getAt(path) || []).forEach((_, i) => {
      const remove = el("button", {type: "button", "data-remove": pathName([...path, i])}, "remove");
      remove.addEventListener("click", () => {
        getAt(path).splice(i, 1);
        if (getAt(path).length === 0) setAt(path, undefined);
        draw(); scheduleCheck();
      });
      const box = el("fieldset", {}, el("legend", {}, `${spec.key}[${i}] `, remove));
      renderModel(box, spec.model, [...path, i]);
      items.append(box);
    });
  };
  add.addEventListener("click", () => {
    const list = getAt(path) || [];
    list.push({});
    setAt(path, list);
    draw(); scheduleCheck();
  });
  block.append(items, add);
  draw();
  if (hasValues(getAt(path))) block.open = true;
  return block;
}

function renderModel(container, modelName, path) {
  defs[modelName].fields.forEach((spec) => {
    const fieldPath = [...path, spec.key];
    if (spec.kind === "section") container.append(sectionBlock(spec, fieldPath));
    else if (spec.kind === "list") container.append(listBlock(spec, fieldPath));
    else container.append(fieldRow(spec, fieldPath));
  });
  const extra = getAt([...path, EXTRA]);
  if (extra !== undefined) {
    const spec = {key: "(other keys)", kind: "yaml", doc: "keys this section does not declare " +
                  "(aliases such as taskset:), as YAML; saved as written", default: ""};
    container.append(fieldRow(spec, [...path, EXTRA]));
  }
}

function renderForm() {
  const form = $("form");
  form.replaceChildren();
  renderModel(form, rootModel, []);
}

function scheduleCheck() {
  clearTimeout(checkTimer);
  checkTimer = setTimeout(runCheck, 300);
}

async function runCheck() {
  const seq = ++checkSeq;
  $("problems").textContent = "checking...";
  const result = await api("api/check", {values});
  if (seq !== checkSeq) return;  // a newer check is on its way
  showCheck(result);
}

function showCheck(result) {
  showProblems(result.problems);
  showDerived(result.derived);
  $("yaml").textContent = result.yaml;
}

function showProblems(problems) {
  const box = $("problems");
  box.replaceChildren();
  box.className = problems.length ? "" : "ok";
  if (!problems.length) box.textContent = "No problems: trinity run would start with this config.";
  const list = el("ul");
  problems.forEach((p) => list.append(el("li", {}, p)));
  if (problems.length) box.append(list);
  document.querySelectorAll("[data-problem-path]").forEach((row) => {
    const key = row.getAttribute("data-problem-path");
    const bad = problems.some((p) => p.startsWith(key) && /^[:\s=]/.test(p.slice(key.length)));
    row.classList.toggle("bad", bad);
  });
}

function showDerived(derived) {
  const box = $("derived");
  box.replaceChildren();
  Object.entries(derived).forEach(([stage, pairs]) => {
    if (Object.keys(derived).length > 1) box.append(el("h3", {}, stage));
    pairs.forEach(([key, value]) => box.append(
      el("div", {class: "derived"}, `${key} = ${JSON.stringify(value)}`)));
  });
}

async function loadFile() {
  const path = $("file").value.trim();
  const result = await api("api/load", {path, values: {}});
  if (result.values === null) {
    $("status").textContent = `not loaded: ${result.problems.join("; ")}`;
    return;
  }
  values = result.values;
  renderForm();
  $("status").textContent = `loaded ${path}`;
  runCheck();
}

// The first paint: the opening config and its check came with the form, in one request.
function showOpening(path, opening) {
  values = opening.values;
  renderForm();
  showCheck(opening.check);
  if (!path) return;
  $("status").textContent = opening.load_problems.length
    ? `not loaded: ${opening.load_problems.join("; ")}` : `loaded ${path}`;
}

async function saveFile() {
  const path = $("file").value.trim();
  if (!path) { $("status").textContent = "give a file path to save to"; return; }
  const result = await api("api/save", {path, values});
  $("status").textContent = result.saved ? `saved ${result.saved}`
    : `not saved: ${result.problems.join("; ")}`;
}

async function start() {
  const form = await api("api/form");
  defs = form.defs;
  supported = form.supported;
  rootModel = form.root;
  $("load").addEventListener("click", loadFile);
  $("save").addEventListener("click", saveFile);
  $("file").value = form.path;
  showOpening(form.path, form.opening);
}
start();
