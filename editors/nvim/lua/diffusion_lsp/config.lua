--- Options of diffusion_lsp.setup(): defaults, validation and merging.

local M = {}

---@class diffusion_lsp.Keys
--- Keys are insert-mode mappings; `false` leaves a key unmapped.
---@field accept? string|false Accept the shown suggestion (falls back to the key itself). Default `<Tab>`.
---@field accept_word? string|false Accept its next word (as copilot.vim). Default `<M-Right>`.
---@field accept_line? string|false Accept the rest of its line, or its next line. Default `<M-C-Right>`.
---@field next? string|false Show the next candidate. Default `<M-]>`.
---@field prev? string|false Show the previous candidate. Default `<M-[>`.
---@field trigger? string|false Ask for a suggestion now (all candidates). Default `<M-\>`.
---@field dismiss? string|false Hide the suggestion. Default `<C-]>`.

---@class diffusion_lsp.Opts
---@field cmd? string[] Command that starts the server. Default `{ 'diffusion-lsp' }`.
---@field filetypes? string[] Filetypes to attach to.
---@field root_markers? string[] Files that mark a project root.
---@field settings? table<string, any> The server's `diffusionLsp` settings (every key: `:help diffusion-lsp-settings`, generated from lsp_server/settings.py).
---@field inline? boolean Use inline completion (ghost text) where Neovim has it (0.12+). Default `true`; `false` uses the completion menu.
---@field drafts? boolean Show the fill as it forms (the server's `diffusion/draft`). Default `false`.
---@field keys? diffusion_lsp.Keys

---@class diffusion_lsp.Config
---@field cmd string[]
---@field filetypes string[]
---@field root_markers string[]
---@field settings table<string, any>
---@field inline boolean
---@field drafts boolean
---@field keys diffusion_lsp.Keys

---@type diffusion_lsp.Config
M.defaults = {
  cmd = { 'diffusion-lsp' },
  -- the languages the server's tree-sitter spans know; other files get line-based fills
  filetypes = {
    'python',
    'javascript',
    'javascriptreact',
    'typescript',
    'typescriptreact',
    'go',
    'rust',
    'java',
    'c',
    'cpp',
    'ruby',
    'lua',
  },
  root_markers = { '.git', 'pyproject.toml', 'package.json', 'go.mod', 'Cargo.toml' },
  settings = {},
  inline = true,
  drafts = false,
  keys = {
    accept = '<Tab>',
    accept_word = '<M-Right>',
    accept_line = '<M-C-Right>',
    next = '<M-]>',
    prev = '<M-[>',
    trigger = '<M-\\>',
    dismiss = '<C-]>',
  },
}

--- vim.validate in its 0.11+ form, or the table form on 0.10.
---@param name string
---@param value any
---@param types string|string[]
---@param optional boolean
local function check(name, value, types, optional)
  if vim.fn.has('nvim-0.11') == 1 then
    vim.validate(name, value, types, optional)
  else
    vim.validate({ [name] = { value, types, optional } })
  end
end

---@param name string
---@param value any
local function check_list(name, value)
  check(name, value, 'table', true)
  for i, item in ipairs(value or {}) do
    check(('%s[%d]'):format(name, i), item, 'string', false)
  end
end

--- Validate user options (errors name the bad option) and merge them over the defaults.
---@param opts? diffusion_lsp.Opts
---@return diffusion_lsp.Config
function M.resolve(opts)
  check('opts', opts, 'table', true)
  opts = opts or {}
  check_list('cmd', opts.cmd)
  if opts.cmd and #opts.cmd == 0 then
    error('cmd: expected a non-empty list', 2)
  end
  check_list('filetypes', opts.filetypes)
  check_list('root_markers', opts.root_markers)
  check('settings', opts.settings, 'table', true)
  check('inline', opts.inline, 'boolean', true)
  check('drafts', opts.drafts, 'boolean', true)
  check('keys', opts.keys, 'table', true)
  for key, value in pairs(opts.keys or {}) do
    if M.defaults.keys[key] == nil then
      error(('keys.%s: unknown key (expected one of accept, accept_word, accept_line, next, prev, trigger, dismiss)'):format(key), 2)
    end
    check('keys.' .. key, value, { 'string', 'boolean' }, true)
    if value == true then
      error(('keys.%s: expected a key or false'):format(key), 2)
    end
  end
  local config = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts) --[[@as diffusion_lsp.Config]]
  -- lists replace the defaults rather than merge with them
  config.cmd = opts.cmd or config.cmd
  config.filetypes = opts.filetypes or M.defaults.filetypes
  config.root_markers = opts.root_markers or M.defaults.root_markers
  -- the server sends drafts only when asked to
  if config.settings.drafts == nil then
    config.settings.drafts = config.drafts
  end
  return config
end

return M
