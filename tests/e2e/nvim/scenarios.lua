-- The e2e scenarios: each drives Neovim as a user would (keys, commands) on the fixture
-- copy named by the spec, and records what it saw in h.result for the pytest side.

local api = vim.api
local uv = vim.uv or vim.loop
local S = {}

--- Extmarks of Neovim's inline completion (the ghost text), with their text.
local function ghost(bufnr)
  local ns = api.nvim_get_namespaces()['nvim.lsp.inline_completion']
  if not ns then
    return nil
  end
  local marks = api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true })
  if #marks == 0 then
    return nil
  end
  local _, row, col, details = unpack(marks[1])
  local parts = {}
  for _, chunk in ipairs(details.virt_text or {}) do
    parts[#parts + 1] = chunk[1]
  end
  local lines = { table.concat(parts) }
  for _, vline in ipairs(details.virt_lines or {}) do
    local l = {}
    for _, chunk in ipairs(vline) do
      l[#l + 1] = chunk[1]
    end
    lines[#lines + 1] = table.concat(l)
  end
  return { row = row, col = col, text = table.concat(lines, '\n') }
end

--- Record every inlineCompletion request the client sends and the answer it gets.
local function record_inline_requests(h, client)
  h.result.requests = {}
  local request = client.request
  client.request = function(self, method, params, handler, bufnr)
    if method ~= 'textDocument/inlineCompletion' then
      return request(self, method, params, handler, bufnr)
    end
    local entry = {
      position = params.position,
      version = params.textDocument.version,
      kind = params.context and params.context.triggerKind,
    }
    table.insert(h.result.requests, entry)
    local ok, id = request(self, method, params, function(err, result, ctx)
      entry.answered = true
      entry.error = err and err.message or nil
      local items = type(result) == 'table' and (result.items or result) or {}
      entry.items = #items
      entry.first = items[1] and items[1].insertText or nil
      return handler(err, result, ctx)
    end, bufnr)
    entry.id = id
    return ok, id
  end
end

--- Open the fixture and wait for the server.
local function open(h)
  vim.cmd.edit(vim.fn.fnameescape(h.spec.file))
  local bufnr = api.nvim_get_current_buf()
  h.result.filetype = vim.bo[bufnr].filetype
  local client = h:client(bufnr)
  return bufnr, client
end

--- Record the workspace edits the server asks Neovim to apply.
local function record_applied_edits(h)
  h.result.applied = {}
  local original = vim.lsp.handlers['workspace/applyEdit']
  vim.lsp.handlers['workspace/applyEdit'] = function(err, params, ctx, config)
    table.insert(h.result.applied, params.edit)
    return original(err, params, ctx, config)
  end
end

--- Go to a 1-based line and column, in normal mode.
local function go(line, col)
  api.nvim_win_set_cursor(0, { line, col - 1 })
end

--- Open the fixture, go to the spec's place in insert mode and wait for ghost text;
--- records the text before, the mode, the cursor and the ghost text.
local function ghost_at_cursor(h)
  local bufnr, client = open(h)
  record_inline_requests(h, client)
  h.result.before = h:text(bufnr)
  go(h.spec.line, h.spec.col)
  h:feed('i')
  h.result.mode = api.nvim_get_mode().mode
  local cursor = api.nvim_win_get_cursor(0)
  h.result.cursor = { cursor[1] - 1, cursor[2] }
  h.result.ghost = h:wait(function()
    return ghost(bufnr)
  end, 'ghost text')
  return bufnr
end

--- Press `key` and wait until the buffer changed (and, with `cleared`, the ghost text went).
local function press(h, bufnr, key, what, cleared)
  local before = h:text(bufnr)
  h:feed(key)
  h:wait(function()
    return h:text(bufnr) ~= before and not (cleared and ghost(bufnr))
  end, what)
end

--- (1) Ghost text appears where the user starts typing in insert mode (a blank line that
--- ends a method's body); Tab accepts it.
function S.ghost_text(h)
  local bufnr = ghost_at_cursor(h)
  h.result.unchanged_while_shown = h:text(bufnr) == h.result.before
  press(h, bufnr, '<Tab>', 'the suggestion to be accepted', true)
  h.result.after = h:text(bufnr)
  h:feed('<Esc>')
  vim.cmd.write()
end

--- (1a) Accept a word: the ghost text's next word goes in at the cursor, and the rest
--- comes back as ghost text (the server types through what it showed); Tab takes it.
function S.accept_word(h)
  local bufnr = ghost_at_cursor(h)
  press(h, bufnr, '<M-Right>', 'a word to be accepted')
  h.result.after_word = h:text(bufnr)
  local now = api.nvim_win_get_cursor(0)
  h.result.cursor_after_word = { now[1] - 1, now[2] }
  if #h.result.after_word - #h.result.before < #h.result.ghost.text then -- a word of several
    h.result.rest = h:wait(function()
      return ghost(bufnr)
    end, 'the rest as ghost text')
    press(h, bufnr, '<Tab>', 'the rest to be accepted')
  end
  h.result.after = h:text(bufnr)
  h:feed('<Esc>')
end

--- (1b) Drafts (setup `drafts = true`): the fill as it forms, rendered as an extmark while
--- the request runs; the answer replaces it with the ghost text.
function S.drafts(h)
  local bufnr, client = open(h)
  record_inline_requests(h, client)
  local drafts = require('diffusion_lsp.drafts')
  h.result.drafts = {}
  local show = drafts.show
  drafts.show = function(buf, client_id, params)
    show(buf, client_id, params)
    local marks = api.nvim_buf_get_extmarks(buf, drafts.namespace, 0, -1, { details = true })
    local shown = {}
    for _, mark in ipairs(marks) do
      for _, chunk in ipairs(mark[4].virt_text or {}) do
        shown[#shown + 1] = chunk[1]
      end
    end
    table.insert(h.result.drafts, { text = params.text, rendered = table.concat(shown) })
  end
  go(h.spec.line, h.spec.col)
  h:feed('i')
  h.result.ghost = h:wait(function()
    return ghost(bufnr)
  end, 'ghost text')
  h.result.drafts_left = #api.nvim_buf_get_extmarks(bufnr, drafts.namespace, 0, -1, {})
  h:feed('<Esc>')
end

--- (2) :DiffusionFillHoles fills every hole of the buffer.
function S.fill_holes(h)
  local bufnr = open(h)
  record_applied_edits(h)
  h.result.before = h:text(bufnr)
  h:feed(':DiffusionFillHoles<CR>')
  h:wait(function()
    return #h.result.applied > 0 and h:text(bufnr) ~= h.result.before
  end, 'the holes to be filled')
  h.result.after = h:text(bufnr)
  vim.cmd.write()
end

--- (3) :'<,'>DiffusionRegenerate on a visual selection replaces it.
function S.regenerate(h)
  local bufnr = open(h)
  record_applied_edits(h)
  h.result.before = h:text(bufnr)
  go(h.spec.line, 1)
  h:feed('V')
  h:feed(':DiffusionRegenerate<CR>') -- the command line starts with '<,'>
  h:wait(function()
    return #h.result.applied > 0 and h:text(bufnr) ~= h.result.before
  end, 'the selection to be regenerated')
  h.result.after = h:text(bufnr)
  vim.cmd.write()
end

--- (5) A next edit: the user renames a variable where it is defined (`cw`), asks with
--- :DiffusionNextEdit (the suggestion is shown: the old text marked, the new text beside
--- it), and takes it with :DiffusionNextEdit again.
function S.next_edit(h)
  local bufnr = open(h)
  h.result.original = h:text(bufnr)
  go(h.spec.line, h.spec.col)
  h:feed('cwacc<Esc>')
  h.result.before = h:text(bufnr)
  h:feed(':DiffusionNextEdit<CR>')
  local actions = require('diffusion_lsp.actions')
  local marks = h:wait(function()
    local found = api.nvim_buf_get_extmarks(bufnr, actions.namespace, 0, -1, { details = true })
    return #found > 0 and found or nil
  end, 'the next edit to be shown')
  local shown = {}
  for _, m in ipairs(marks) do
    local details = m[4]
    for _, chunk in ipairs(details.virt_text or {}) do
      shown[#shown + 1] = chunk[1]
    end
    for _, line in ipairs(details.virt_lines or {}) do
      shown[#shown + 1] = line[1][1]
    end
    if details.hl_group == 'DiffusionEditOld' then
      h.result.marked = { m[2], m[3], details.end_row, details.end_col }
    end
  end
  h.result.shown = table.concat(shown, '\n')
  h.result.unchanged_while_shown = h:text(bufnr) == h.result.before
  h:feed(':DiffusionNextEdit<CR>')
  h:wait(function()
    return h:text(bufnr) ~= h.result.before
  end, 'the next edit to be applied')
  h.result.after = h:text(bufnr)
  h.result.marks_after = #api.nvim_buf_get_extmarks(bufnr, actions.namespace, 0, -1, {})
  vim.cmd.write()
end

--- (4) The suggest key and the dismiss key, through Neovim's public inline completion
--- API only. The server waits debounceMs (set long by the test) before a fill the user
--- did not ask for, so a suggestion that comes sooner was served as asked for.
function S.suggest_now(h)
  local bufnr, client = open(h)
  record_inline_requests(h, client)
  h.result.before = h:text(bufnr)
  go(h.spec.line, h.spec.col)
  h:feed('i')
  local plugin = require('diffusion_lsp')
  local asked = uv.now()
  plugin.trigger(bufnr)
  plugin.trigger(bufnr) -- pressed twice: still one suggestion
  h.result.ghost = h:wait(function()
    return ghost(bufnr)
  end, 'ghost text')
  h.result.ghost_ms = uv.now() - asked
  plugin.dismiss(bufnr)
  h:wait(function()
    return ghost(bufnr) == nil
  end, 'the suggestion to be hidden')
  h.result.unchanged_while_shown = h:text(bufnr) == h.result.before
  plugin.trigger(bufnr) -- asked again: shown again, and Tab's function accepts it
  h.result.ghost_again = h:wait(function()
    return ghost(bufnr)
  end, 'ghost text again')
  assert(vim.lsp.inline_completion.get(), 'nothing to accept')
  h:wait(function()
    return h:text(bufnr) ~= h.result.before
  end, 'the suggestion to be accepted')
  h.result.after = h:text(bufnr)
  vim.cmd.write()
end

return S
