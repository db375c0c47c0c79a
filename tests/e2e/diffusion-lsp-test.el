;;; diffusion-lsp-test.el --- End-to-end tests: real eglot, real diffusion-lsp  -*- lexical-binding: t; -*-

;;; Commentary:

;; Run by tests/e2e/test_emacs.py, one test per Emacs:
;;
;;   DIFFUSION_LSP_TEST_SERVER="python3 -m lsp_server" DIFFUSION_LSP_TEST_PYTHON=python3 \
;;   emacs --batch -L editors/emacs -l ert -l tests/e2e/diffusion-lsp-test.el \
;;     --eval '(ert-run-tests-batch-and-exit "SELECTOR")'
;;
;; (or `t' for the whole suite).  Each test visits a fresh copy of a fixture from
;; fixtures/e2e (DIFFUSION_LSP_TEST_FIXTURES to use other ones) in python-mode, connects eglot through the
;; `eglot-server-programs' entry of `diffusion-lsp-eglot-mode' (so the server started is
;; the one that entry names, with its initializationOptions), and drives it as a
;; user would.  The model is small and weak: the tests never look at what a fill
;; says, only that it is there, in place, and that the file still parses.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'eglot)
(require 'python)
(require 'diffusion-lsp)
(diffusion-lsp-eglot-mode 1)            ; loading alone changes nothing

(defvar diffusion-lsp-test-fixtures
  (or (getenv "DIFFUSION_LSP_TEST_FIXTURES")
      (expand-file-name "../../fixtures/e2e" (file-name-directory (or load-file-name buffer-file-name))))
  "The fixture files; each test edits and saves a copy of its own.")

(defvar diffusion-lsp-test-python (or (getenv "DIFFUSION_LSP_TEST_PYTHON") "python3")
  "The Python that checks that a file parses.")

(defconst diffusion-lsp-test-wait-seconds 120
  "Upper bound on any wait for the server, so that a broken run ends.")

(when-let ((server (getenv "DIFFUSION_LSP_TEST_SERVER")))
  (setq diffusion-lsp-server-command (split-string-and-unquote server)))

;; A remote engine instead of the local model: the two settings a user sets.
(when-let ((endpoint (getenv "DIFFUSION_LSP_TEST_ENDPOINT")))
  (setq diffusion-lsp-endpoint endpoint
        diffusion-lsp-dialect (or (getenv "DIFFUSION_LSP_TEST_DIALECT") "llama-infill")))

(setq eglot-sync-connect t
      eglot-connect-timeout diffusion-lsp-test-wait-seconds
      diffusion-lsp-request-timeout diffusion-lsp-test-wait-seconds
      eglot-autoshutdown nil
      python-indent-guess-indent-offset nil)

(defun diffusion-lsp-test-wait (predicate)
  "Process server output until PREDICATE is non-nil (or the wait bound); return it."
  (let ((deadline (+ (float-time) diffusion-lsp-test-wait-seconds)))
    (while (and (not (funcall predicate)) (< (float-time) deadline))
      (accept-process-output nil 0.05))
    (funcall predicate)))

(defun diffusion-lsp-test-parse-error ()
  "nil when the buffer's text parses as Python, else Python's error message."
  (let ((source (buffer-substring-no-properties (point-min) (point-max))))
    (with-temp-buffer
      (insert source)
      (let ((status (call-process-region
                     (point-min) (point-max) diffusion-lsp-test-python t t nil
                     "-c" "import ast, sys; ast.parse(sys.stdin.read())")))
        (unless (eql status 0)
          (format "%s\n--- buffer ---\n%s" (buffer-string) source))))))

(defmacro diffusion-lsp-test-with-file (file &rest body)
  "Visit FILE (in `diffusion-lsp-test-dir') connected to diffusion-lsp, run BODY."
  (declare (indent 1) (debug t))
  `(let* ((dir (make-temp-file "diffusion-lsp-test" t))
          (path (expand-file-name ,file dir))
          (buffer (progn (copy-file (expand-file-name ,file diffusion-lsp-test-fixtures) path)
                         (find-file-noselect path))))
     (unwind-protect
         (with-current-buffer buffer
           (switch-to-buffer buffer)        ; keys typed below go to this buffer
           (apply #'eglot (eglot--guess-contact))
           (should (diffusion-lsp-test-wait
                    (lambda () (and eglot--managed-mode (eglot-current-server)))))
           (should (cl-typep (eglot-current-server) 'diffusion-lsp-server))
           ,@body)
       (with-current-buffer buffer
         (when-let ((server (eglot-current-server)))
           (ignore-errors (eglot-shutdown server)))
         (set-buffer-modified-p nil))
       (kill-buffer buffer)
       (delete-directory dir t))))

(defun diffusion-lsp-test-goto (text &optional after)
  "Move point to the start of TEXT in the buffer (to its end when AFTER)."
  (goto-char (point-min))
  (should (search-forward text nil t))
  (unless after (goto-char (match-beginning 0))))

(defun diffusion-lsp-test-return-site (text)
  "Turn the line `return TEXT' into `return ' with point at its end: a user
about to write a return value, in a function body."
  (diffusion-lsp-test-goto (concat "return " text) t)
  (delete-region (- (point) (length text)) (point)))

(defvar diffusion-lsp-test-server-messages nil
  "The server's window/showMessage texts, newest first.")

(cl-defmethod eglot-handle-notification :before
  (_server (_method (eql window/showMessage)) &key message &allow-other-keys)
  "Record the server's MESSAGE, for the failure report of a test."
  (push message diffusion-lsp-test-server-messages))

(defun diffusion-lsp-test-no-fill (what)
  "Fail the test: the server applied no fill for WHAT (with the shipped, weak
model, no fill parsed there: the fixture's site may need re-picking)."
  (ert-fail (list (format "the server applied no fill for %s: nothing to check" what)
                  :server-said (reverse diffusion-lsp-test-server-messages))))

(defun diffusion-lsp-test-edits (edit what)
  "The TextEdits (a list) of the one document change of workspace edit EDIT,
the server's answer for WHAT; a clear failure when there is none."
  (unless edit
    (diffusion-lsp-test-no-fill what))
  (let ((changes (plist-get edit :documentChanges)))
    (should (= (length changes) 1))
    (append (plist-get (aref changes 0) :edits) nil)))

(defun diffusion-lsp-test-apply (text edits)
  "TEXT (the buffer before) with the TextEdits EDITS applied, as a string."
  (with-temp-buffer
    (insert text)
    (let ((regions (mapcar (lambda (e)
                             (let ((r (eglot--range-region (plist-get e :range) t)))
                               (list (car r) (cdr r) (plist-get e :newText))))
                           edits)))
      (pcase-dolist (`(,beg ,end ,new) regions)
        (delete-region beg end)
        (goto-char beg)
        (insert new)))
    (buffer-string)))

(defconst diffusion-lsp-test-sites
  '("return area" "return math.pi * radius * radius" "return total"
    "return f\"" "{label}: ")
  "Cursors in function bodies of emacs_shapes.py (just after these texts),
tried in this order: the shipped model is weak, and at some cursors it has
nothing to add (an empty fill is a valid answer, with no item).")

(defun diffusion-lsp-test-at-some-site (try)
  "Call TRY at the end of each of `diffusion-lsp-test-sites' until it returns
non-nil; return that value (a failed `should' when no site gives one)."
  (should (cl-loop for site in diffusion-lsp-test-sites
                   thereis (progn (diffusion-lsp-test-goto site t)
                                  (funcall try)))))

(defvar diffusion-lsp-test-answers nil
  "(GENERATION . ANSWER) of each inline completion answer, newest first.")

(defun diffusion-lsp-test-record-answer (generation _tick answer)
  "Record an inline completion ANSWER to request GENERATION."
  (push (cons generation answer) diffusion-lsp-test-answers))

(advice-add 'diffusion-lsp--show :before #'diffusion-lsp-test-record-answer)

(defun diffusion-lsp-test-ghost ()
  "Ask for an inline completion at point; wait for the answer; the ghost overlay or nil."
  (setq diffusion-lsp-test-answers nil)
  (diffusion-lsp-inline-complete)
  (should (diffusion-lsp-test-wait (lambda () diffusion-lsp-test-answers)))
  diffusion-lsp--ghost)

;;;; Settings reach the server

(ert-deftest diffusion-lsp-test-initialization-options ()
  "The entry starts diffusion-lsp, and the defcustoms are its initializationOptions:
an invalid value comes back as the server's warning naming it."
  (let ((diffusion-lsp-alternatives 99))
    (diffusion-lsp-test-with-file "emacs_shapes.py"
      (let ((events (jsonrpc-events-buffer (eglot-current-server))))
        (should (diffusion-lsp-test-wait
                 (lambda ()
                   (with-current-buffer events
                     (save-excursion
                       (goto-char (point-min))
                       (search-forward "diffusionLsp.alternatives must be" nil t))))))
        (with-current-buffer events
          (goto-char (point-min))
          (should (search-forward ":alternatives 99" nil t))
          (should (search-forward ":drafts :json-false" nil t)))))))

;;;; (1) completion-at-point

(defun diffusion-lsp-test-fill-offered-p ()
  "Non-nil when eglot's completion table at point offers the fill (the ✦
item) for what is typed before point, as `completion-at-point' filters it."
  (pcase-let ((`(,start ,_end ,table) (eglot-completion-at-point)))
    (cl-some (lambda (label) (string-prefix-p "✦" label))
             (all-completions (buffer-substring-no-properties start (point)) table))))

(ert-deftest diffusion-lsp-test-completion-at-point ()
  "eglot's completion-at-point offers the fill (the ✦ item) at a cursor in a
function body; completing puts non-empty text at point, in place of nothing
else (eglot 1.9's exit function, unmended, deletes the line break after point
when the item's label is shorter than the word before point), and the file
still parses."
  (diffusion-lsp-test-with-file "emacs_shapes.py"
    (diffusion-lsp-test-at-some-site #'diffusion-lsp-test-fill-offered-p)
    (let ((start (point))
          (before (buffer-string)))
      (should (completion-at-point))
      (let ((inserted (buffer-substring-no-properties start (point))))
        (should (string-match-p "[^[:space:]]" inserted))
        (should-not (string-match-p "✦" (buffer-string)))
        (should (equal (buffer-string)
                       (concat (substring before 0 (1- start)) inserted
                               (substring before (1- start)))))
        (should-not (diffusion-lsp-test-parse-error))
        (save-buffer)))))

;;;; (2) inline completion as an overlay, TAB accepts

(ert-deftest diffusion-lsp-test-inline-overlay-tab-accepts ()
  "The ghost text appears after point as an overlay, without changing the
buffer; TAB (through the keymap, as typed) inserts it; the file still parses."
  (diffusion-lsp-test-with-file "emacs_shapes.py"
    (diffusion-lsp-inline-mode-maybe)     ; what eglot-managed-mode-hook runs
    (should diffusion-lsp-inline-mode)
    (let* ((before (buffer-string))
           (ghost (diffusion-lsp-test-at-some-site #'diffusion-lsp-test-ghost))
           (start (point))
           (text (overlay-get ghost 'diffusion-lsp-text)))
      (should (= (overlay-start ghost) start))
      (should (string-match-p "[^[:space:]]" (overlay-get ghost 'after-string)))
      (should (equal (buffer-string) before)) ; shown, not inserted
      (should (eq (key-binding (kbd "TAB")) #'diffusion-lsp-inline-accept))
      (execute-kbd-macro (kbd "TAB"))
      (should-not diffusion-lsp--ghost)
      (should-not (overlay-buffer ghost))
      (should (equal (buffer-substring-no-properties start (point)) text))
      (should (equal (buffer-string)
                     (concat (substring before 0 (1- start)) text (substring before (1- start)))))
      (should-not (diffusion-lsp-test-parse-error))
      (should-not (eq (key-binding (kbd "TAB")) #'diffusion-lsp-inline-accept))
      (save-buffer))))

;;;; (2b) accepting the ghost text a word at a time

(ert-deftest diffusion-lsp-test-inline-accept-word-then-tab ()
  "M-<right> (through the keymap, as typed) inserts the ghost text's next word
and shows the rest after point; TAB then inserts that rest, so the buffer ends
as TAB alone would have left it."
  (diffusion-lsp-test-with-file "emacs_shapes.py"
    (diffusion-lsp-inline-mode-maybe)
    (let* ((before (buffer-string))
           (ghost (diffusion-lsp-test-at-some-site #'diffusion-lsp-test-ghost))
           (start (point))
           (text (overlay-get ghost 'diffusion-lsp-text)))
      (should (eq (key-binding (kbd "M-<right>")) #'diffusion-lsp-inline-accept-word))
      (execute-kbd-macro (kbd "M-<right>"))
      (let ((word (buffer-substring-no-properties start (point))))
        (should (string-prefix-p word text))
        (should (< 0 (length word)))
        (unless (equal word text)         ; a suggestion of one word is accepted whole
          (should (string-match-p
                   "\\`[[:space:]]*\\(?:[[:alnum:]_]+\\|[^[:alnum:]_[:space:]]+\\)\\'" word))
          (should diffusion-lsp--ghost)
          (should (= (overlay-start diffusion-lsp--ghost) (point)))
          (should (equal (substring-no-properties (overlay-get diffusion-lsp--ghost 'after-string))
                         (substring text (length word))))
          (execute-kbd-macro (kbd "TAB"))))
      (should-not diffusion-lsp--ghost)
      (should (equal (buffer-string)
                     (concat (substring before 0 (1- start)) text (substring before (1- start)))))
      (save-buffer))))

(defvar diffusion-lsp-test-drafts-shown nil
  "The texts of the draft overlay each time one was shown, newest first.")

(advice-add 'diffusion-lsp--show-draft :after
            (lambda (&rest _)
              (when-let ((draft diffusion-lsp--draft))
                (push (substring-no-properties (overlay-get draft 'after-string))
                      diffusion-lsp-test-drafts-shown))))

(ert-deftest diffusion-lsp-test-drafts ()
  "With `diffusion-lsp-drafts' on, the fill is shown as it forms (diffusion/draft
notifications, an overlay after point) while the request is pending, and the
answer replaces the draft with the ghost text."
  (let ((diffusion-lsp-drafts t))
    (diffusion-lsp-test-with-file "emacs_shapes.py"
      (diffusion-lsp-inline-mode 1)
      (let ((before (buffer-string))
            (ghost (diffusion-lsp-test-at-some-site
                    (lambda ()
                      (setq diffusion-lsp-test-drafts-shown nil) ; this site's drafts only
                      (and (diffusion-lsp-test-ghost) diffusion-lsp-test-drafts-shown)))))
        (should ghost)
        (should (cl-every (lambda (d) (string-match-p "[^[:space:]]" d)) diffusion-lsp-test-drafts-shown))
        (should-not diffusion-lsp--draft)     ; the answer cleared it
        (should-not diffusion-lsp--pending)
        (should diffusion-lsp--ghost)
        (should (equal (buffer-string) before))))))

(ert-deftest diffusion-lsp-test-inline-dismissed ()
  "The ghost text goes away on the next command, and when the buffer changes."
  (diffusion-lsp-test-with-file "emacs_shapes.py"
    (diffusion-lsp-inline-mode 1)
    (let ((before (buffer-string))
          (ghost (diffusion-lsp-test-at-some-site #'diffusion-lsp-test-ghost))
          (site (point)))
      (execute-kbd-macro (kbd "C-b"))
      (should-not diffusion-lsp--ghost)
      (should-not (overlay-buffer ghost))
      (should (equal (buffer-string) before))
      (goto-char site)
      (setq ghost (diffusion-lsp-test-ghost))
      (should ghost)
      (insert " ")
      (should-not diffusion-lsp--ghost)
      (should-not (overlay-buffer ghost)))))

(ert-deftest diffusion-lsp-test-inline-asks-after-an-edit ()
  "A typed character schedules an automatic request (triggerKind 2) for when
Emacs is idle; it is sent and answered.  (Batch Emacs is never idle: the test
fires the idle timer itself.)"
  (diffusion-lsp-test-with-file "emacs_shapes.py"
    (diffusion-lsp-inline-mode 1)
    (diffusion-lsp-test-goto "return f\"" t)
    (setq diffusion-lsp-test-answers nil)
    (execute-kbd-macro "x")
    (should (looking-back "return f\"x" (line-beginning-position)))
    (should (timerp diffusion-lsp--idle-timer))
    (let ((sent nil))
      (cl-letf* ((request (symbol-function 'jsonrpc-async-request))
                 ((symbol-function 'jsonrpc-async-request)
                  (lambda (server method params &rest args)
                    (push (cons method params) sent)
                    (apply request server method params args))))
        (timer-event-handler diffusion-lsp--idle-timer)
        (should (diffusion-lsp-test-wait (lambda () diffusion-lsp-test-answers))))
      (should (equal (mapcar #'car sent) '(:textDocument/inlineCompletion)))
      (should (equal (plist-get (cdar sent) :context) '(:triggerKind 2))))))

;;;; (3) fill all holes

(defun diffusion-lsp-test-range-text (text range)
  "The part of TEXT that the LSP RANGE covers."
  (with-temp-buffer
    (insert text)
    (let ((region (eglot--range-region range)))
      (buffer-substring-no-properties (car region) (cdr region)))))

(defun diffusion-lsp-test-fill-holes ()
  "Run \"Fill all holes in file\" on emacs_holes.py; check what the client did
with the server's edit, and return (BEFORE . EDITS)."
  (let* ((before (buffer-string))
         (edits (diffusion-lsp-test-edits (diffusion-lsp-fill-holes) "the holes of emacs_holes.py"))
         (replaced (mapcar (lambda (e) (diffusion-lsp-test-range-text before (plist-get e :range)))
                           edits)))
    (when (< (length edits) 2)
      (diffusion-lsp-test-no-fill (format "%d of the 2 holes of emacs_holes.py" (- 2 (length edits)))))
    (should (= (length edits) 2))
    (should (member "..." replaced))
    (should (cl-some (lambda (s) (string-prefix-p "# TODO" s)) replaced))
    (should (equal (buffer-string) (diffusion-lsp-test-apply before edits)))
    (should-not (string-match-p "# TODO\\|\\.\\.\\." (buffer-string)))
    (save-buffer)
    (cons before edits)))

(ert-deftest diffusion-lsp-test-fill-all-holes ()
  "\"Fill all holes in file\" (a code action run as a command; the server applies
its edit through workspace/applyEdit) replaces both holes, and nothing else."
  (diffusion-lsp-test-with-file "emacs_holes.py"
    (diffusion-lsp-test-fill-holes)))

(ert-deftest diffusion-lsp-test-fill-all-holes-parses ()
  "After \"Fill all holes in file\" each hole has code in it and the file parses."
  (diffusion-lsp-test-with-file "emacs_holes.py"
    (dolist (edit (cdr (diffusion-lsp-test-fill-holes)))
      (should (string-match-p "[^[:space:]]" (plist-get edit :newText))))
    (should-not (diffusion-lsp-test-parse-error))))

;;;; (4) regenerate region

(defun diffusion-lsp-test-regenerate ()
  "Select `width * height' and regenerate it; check what the client did with the
server's edit; return the edit's new text."
  (diffusion-lsp-test-goto "width * height")
  (let* ((beg (point))
         (end (+ beg (length "width * height")))
         (before (buffer-string)))
    (set-mark beg)
    (goto-char end)
    (activate-mark)
    (let* ((edits (diffusion-lsp-test-edits (call-interactively #'diffusion-lsp-regenerate-region)
                                             "`width * height' in emacs_shapes.py"))
           (range (plist-get (car edits) :range)))
      (should (= (length edits) 1))
      (with-temp-buffer
        (insert before)
        (let ((region (eglot--range-region range)))
          (should (<= (car region) beg end (cdr region)))))
      (should (equal (buffer-string) (diffusion-lsp-test-apply before edits)))
      (save-buffer)
      (plist-get (car edits) :newText))))

(ert-deftest diffusion-lsp-test-regenerate-region ()
  "Regenerate region replaces the region (grown to whole syntax nodes) with the
server's text; everything outside it is untouched."
  (diffusion-lsp-test-with-file "emacs_shapes.py"
    (diffusion-lsp-test-regenerate)))

(ert-deftest diffusion-lsp-test-regenerate-region-parses ()
  "The regenerated region has code in it and the file parses."
  (diffusion-lsp-test-with-file "emacs_shapes.py"
    (should (string-match-p "[^[:space:]]" (diffusion-lsp-test-regenerate)))
    (should-not (diffusion-lsp-test-parse-error))))

;;;; (5) a second request while the first runs

(ert-deftest diffusion-lsp-test-second-request-supersedes-first ()
  "Two inline requests sent back to back (no server output read between them),
at two cursors: the second is served and shown at its cursor; the answer to
the first is dropped (the server stops the first fill when the second arrives
and answers it null; the client ignores whatever the first gets)."
  (diffusion-lsp-test-with-file "emacs_shapes.py"
    (diffusion-lsp-inline-mode 1)
    (diffusion-lsp-test-at-some-site #'diffusion-lsp-test-ghost)
    (let ((second-site (point)))
      (diffusion-lsp-inline-dismiss)
      (diffusion-lsp-test-goto "label = name.title()" t)
      (setq diffusion-lsp-test-answers nil)
      (diffusion-lsp-inline-complete)
      (let ((first-generation diffusion-lsp--generation))
        (goto-char second-site)
        (diffusion-lsp-inline-complete)
        (should (diffusion-lsp-test-wait (lambda () (= (length diffusion-lsp-test-answers) 2))))
        (should diffusion-lsp--ghost)
        (should (= (overlay-start diffusion-lsp--ghost) second-site))
        (should (= diffusion-lsp--stale-answers 1))
        (let ((first (assq first-generation diffusion-lsp-test-answers)))
          (should first)
          (message "diffusion-lsp-test: the first request was answered %s"
                   (if (cdr first) "with items (dropped by the client)"
                     "null (the server stopped its fill)")))))))

;;;; Next edit

(ert-deftest diffusion-lsp-test-next-edit ()
  "After a rename, diffusion/inlineEdit proposes the name's other use, for the
buffer's current version; the suggestion is shown (old text struck through, new
text after it) while Emacs asks, and applying it changes only that use.
`diffusion-lsp-edit-margin' -100 keeps what the edit implies whatever the
shipped weights think of it (the model's judgment is the unit tests')."
  (let ((diffusion-lsp-edit-margin -100))
    (diffusion-lsp-test-with-file "emacs_shapes.py"
      (diffusion-lsp-test-goto "label = name.title()")
      (kill-word 1)                       ; the developer renames `label'...
      (insert "title")                    ; ...where it is defined
      (let* ((before (buffer-string))
             (version eglot--versioned-identifier)
             edit shown
             (capture (lambda (answer) (setq edit answer)))
             (preview (lambda (&rest _)
                        (setq shown (cl-loop for o in (overlays-in (point-min) (point-max))
                                             when (eq (overlay-get o 'face) 'diffusion-lsp-edit-removed)
                                             collect (overlay-get o 'after-string)))
                        t)))
        (advice-add 'diffusion-lsp--request-next-edit :filter-return capture)
        (unwind-protect
            (cl-letf (((symbol-function 'y-or-n-p) preview))
              (diffusion-lsp-next-edit))
          (advice-remove 'diffusion-lsp--request-next-edit capture))
        (should edit)
        (should (equal (plist-get (plist-get edit :textDocument) :version) version))
        (should (equal (plist-get edit :text) "title"))
        (should (equal shown (list "title")))
        (should (equal (buffer-string)
                       (replace-regexp-in-string "{label}" "{title}" before t t)))
        (should-not (diffusion-lsp-test-parse-error))
        (message "diffusion-lsp-test: next edit suggested and applied")))))

(provide 'diffusion-lsp-test)
;;; diffusion-lsp-test.el ends here
