from shardload.cli.app import main

raise SystemExit(main())
