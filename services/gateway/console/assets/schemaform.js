// A form generated from a tool's JSON Schema (inputSchema): numbers with
// both bounds become sliders with a number box, other numbers bounded
// inputs, enums selects, booleans toggles, strings text boxes; anything
// else (arrays, nested objects, schemas without properties) a JSON box.
// read() returns the arguments or throws an Error naming the field, so a
// call the schema would refuse is not sent.

import { h } from './lib.js';

let seq = 0;

function typeOf(s) {
  if (!s || typeof s !== 'object') return '';
  let t = s.type;
  if (Array.isArray(t)) t = t.find(x => x !== 'null') || '';
  if (!t && Array.isArray(s.enum)) return 'enum';
  return t || '';
}

function jsonBox(name, value) {
  return h('textarea', { name, rows: 4, spellcheck: 'false', class: 'mono', value: value === undefined ? '' : JSON.stringify(value, null, 2) });
}

// fieldFor returns {el, read} for one property.
function fieldFor(name, s, required) {
  const id = 'f' + (++seq);
  const t = typeOf(s);
  const title = s.title || name;
  const hints = [];
  if (s.description) hints.push(s.description);
  const label = h('label', { for: id, class: 'label' }, title, required ? h('abbr', { title: 'required', text: ' *' }) : null);
  let control;
  let read;
  if (Array.isArray(s.enum)) {
    control = h('select', { id, name },
      required ? null : h('option', { value: '', text: '(not set)' }),
      s.enum.map((v, i) => h('option', { value: String(i), text: typeof v === 'string' ? v : JSON.stringify(v) })));
    if (s.default !== undefined) {
      const i = s.enum.findIndex(v => JSON.stringify(v) === JSON.stringify(s.default));
      if (i >= 0) control.value = String(i);
    }
    read = () => (control.value === '' ? undefined : s.enum[Number(control.value)]);
  } else if (t === 'boolean') {
    control = h('input', { id, name, type: 'checkbox', role: 'switch', class: 'toggle', checked: s.default === true });
    // An optional boolean the user never touched is left out.
    let touched = required || s.default !== undefined;
    control.addEventListener('change', () => { touched = true; });
    read = () => (touched ? control.checked : undefined);
  } else if (t === 'integer' || t === 'number') {
    const min = typeof s.minimum === 'number' ? s.minimum : (typeof s.exclusiveMinimum === 'number' ? s.exclusiveMinimum : undefined);
    const max = typeof s.maximum === 'number' ? s.maximum : (typeof s.exclusiveMaximum === 'number' ? s.exclusiveMaximum : undefined);
    const step = t === 'integer' ? 1 : 'any';
    const num = h('input', { id, name, type: 'number', step, inputmode: t === 'integer' ? 'numeric' : 'decimal' });
    if (min !== undefined) num.min = String(min);
    if (max !== undefined) num.max = String(max);
    if (s.default !== undefined) num.value = String(s.default);
    if (min !== undefined && max !== undefined) {
      const slider = h('input', { type: 'range', min: String(min), max: String(max), step: t === 'integer' ? '1' : String((max - min) / 100), 'aria-label': title + ' slider' });
      slider.value = num.value || String(min);
      if (!num.value && required) num.value = slider.value;
      slider.addEventListener('input', () => { num.value = slider.value; });
      num.addEventListener('input', () => { if (num.value !== '') slider.value = num.value; });
      control = h('div', { class: 'slider' }, slider, num);
      hints.push(min + ' to ' + max);
    } else {
      control = num;
      if (min !== undefined) hints.push('at least ' + min);
      if (max !== undefined) hints.push('at most ' + max);
    }
    read = () => {
      if (num.value === '') return undefined;
      const v = Number(num.value);
      if (!Number.isFinite(v)) throw new Error(title + ' must be a number');
      if (t === 'integer' && !Number.isInteger(v)) throw new Error(title + ' must be a whole number');
      if (typeof s.minimum === 'number' && v < s.minimum) throw new Error(title + ' must be at least ' + s.minimum);
      if (typeof s.maximum === 'number' && v > s.maximum) throw new Error(title + ' must be at most ' + s.maximum);
      if (typeof s.exclusiveMinimum === 'number' && v <= s.exclusiveMinimum) throw new Error(title + ' must be more than ' + s.exclusiveMinimum);
      if (typeof s.exclusiveMaximum === 'number' && v >= s.exclusiveMaximum) throw new Error(title + ' must be less than ' + s.exclusiveMaximum);
      return v;
    };
  } else if (t === 'string') {
    control = h('input', { id, name, type: 'text', autocomplete: 'off' });
    if (typeof s.maxLength === 'number') control.maxLength = s.maxLength;
    if (s.default !== undefined) control.value = String(s.default);
    read = () => {
      const v = control.value;
      if (v === '') return undefined;
      if (typeof s.minLength === 'number' && v.length < s.minLength) throw new Error(title + ' needs at least ' + s.minLength + ' characters');
      if (s.pattern) {
        let re = null;
        try { re = new RegExp(s.pattern, 'u'); } catch { re = null; }
        if (re && !re.test(v)) throw new Error(title + ' must match ' + s.pattern);
      }
      return v;
    };
  } else {
    control = jsonBox(name, s.default);
    control.id = id;
    hints.push('JSON' + (t ? ' (' + t + ')' : ''));
    read = () => {
      if (control.value.trim() === '') return undefined;
      try { return JSON.parse(control.value); } catch (e) { throw new Error(title + ' is not valid JSON: ' + e.message); }
    };
  }
  const el = h('div', { class: 'field' }, label, control, hints.length ? h('small', { class: 'hint', text: hints.join(' · ') }) : null);
  return {
    el,
    read: () => {
      const v = read();
      if (v === undefined && required) throw new Error(title + ' is required');
      return v;
    },
  };
}

// buildForm returns {el, read} for a tool's input schema.
export function buildForm(schema) {
  const props = schema && typeof schema === 'object' && schema.properties && typeof schema.properties === 'object' ? schema.properties : null;
  const simple = props && (typeOf(schema) === 'object' || !schema.type);
  if (!simple) {
    // No properties to lay out: one JSON box for the whole arguments object.
    const box = jsonBox('arguments', {});
    box.setAttribute('aria-label', 'arguments (JSON object)');
    return {
      el: h('div', { class: 'field' }, h('span', { class: 'label', text: 'arguments (JSON object)' }), box),
      read: () => {
        let v;
        try { v = JSON.parse(box.value || '{}'); } catch (e) { throw new Error('arguments are not valid JSON: ' + e.message); }
        if (!v || typeof v !== 'object' || Array.isArray(v)) throw new Error('arguments must be a JSON object');
        return v;
      },
    };
  }
  const required = new Set(Array.isArray(schema.required) ? schema.required : []);
  const fields = Object.entries(props).map(([name, s]) => [name, fieldFor(name, s || {}, required.has(name))]);
  return {
    el: h('div', { class: 'fields' }, fields.length ? fields.map(([, f]) => f.el) : h('p', { class: 'muted', text: 'This tool takes no arguments.' })),
    read: () => {
      const out = {};
      for (const [name, f] of fields) {
        const v = f.read();
        if (v !== undefined) out[name] = v;
      }
      return out;
    },
  };
}
