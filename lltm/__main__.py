from lltm.cli import main

raise SystemExit(main())
